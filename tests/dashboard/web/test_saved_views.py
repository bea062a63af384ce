"""Saved views: saved with a CSRF-checked POST, per user, shared within the
project only, opened as a link to the list with its query string."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from tests.dashboard.web.pages_factories import round_record, store

from dashboard.accounts.services import membership_add
from dashboard.web.models import SavedView

pytestmark = pytest.mark.django_db


def views_url(project):
    return reverse("web:saved_views", args=[project.slug])


def save(client, project, name="Errors of user-1", query="user=user-1&has_errors=on&after=123.4", shared=False):
    data = {"name": name, "page": "conversations", "query": query}
    if shared:
        data["shared"] = "on"
    return client.post(views_url(project), data)


@pytest.fixture
def teammate(django_user_model, project):
    user = django_user_model.objects.create_user("cy", password="pw-cy-123456789")
    membership_add(project=project, user=user)
    client = Client()
    client.force_login(user)
    return client


def test_it_saves_a_view_without_its_page_cursor_and_opens_it(client_in, project, member):
    store(project, [round_record("c1", 0, user_id="user-1")])
    response = save(client_in, project)
    assert response.status_code == 302
    view = SavedView.objects.get()
    assert (view.owner, view.query, view.shared) == (member, "has_errors=on&user=user-1", False)
    assert response["Location"] == reverse("web:conversations", args=[project.slug]) + "?" + view.query
    opened = client_in.get(reverse("web:saved_view", args=[project.slug, view.pk]))
    assert opened.status_code == 302 and opened["Location"] == response["Location"]
    assert b"Errors of user-1" in client_in.get(reverse("web:conversations", args=[project.slug])).content


def test_it_requires_the_csrf_token(member, project):
    client = Client(enforce_csrf_checks=True)
    client.force_login(member)
    assert save(client, project).status_code == 403
    assert not SavedView.objects.exists()


def test_it_shows_shared_views_to_members_and_keeps_private_ones_private(client_in, project, teammate):
    save(client_in, project, name="mine only")
    save(client_in, project, name="for the team", shared=True)
    private, shared = SavedView.objects.get(name="mine only"), SavedView.objects.get(name="for the team")
    body = teammate.get(views_url(project)).content.decode()
    assert "for the team" in body and "mine only" not in body
    assert teammate.get(reverse("web:saved_view", args=[project.slug, shared.pk])).status_code == 302
    assert teammate.get(reverse("web:saved_view", args=[project.slug, private.pk])).status_code == 404
    # a member may open a shared view but not delete it
    assert teammate.post(reverse("web:saved_view_delete", args=[project.slug, shared.pk])).status_code == 404
    assert SavedView.objects.filter(pk=shared.pk).exists()


def test_it_answers_404_for_another_projects_views(client_in, project, other_project, stranger):
    theirs = SavedView.objects.create(project=other_project, owner=stranger, name="theirs", shared=True)
    for url in (reverse("web:saved_view", args=[project.slug, theirs.pk]),
                reverse("web:saved_view", args=[other_project.slug, theirs.pk]),
                views_url(other_project)):
        assert client_in.get(url).status_code == 404
    assert client_in.post(reverse("web:saved_view_delete", args=[project.slug, theirs.pk])).status_code == 404
    assert "theirs" not in client_in.get(views_url(project)).content.decode()


def test_it_lets_the_owner_delete_a_view(client_in, project):
    save(client_in, project)
    view = SavedView.objects.get()
    assert client_in.get(reverse("web:saved_view_delete", args=[project.slug, view.pk])).status_code == 405
    assert client_in.post(reverse("web:saved_view_delete", args=[project.slug, view.pk])).status_code == 302
    assert not SavedView.objects.exists()


def test_it_escapes_names(client_in, project):
    evil = "<script>alert(1)</script>"
    assert save(client_in, project, name=evil).status_code == 302
    for url in (views_url(project), reverse("web:conversations", args=[project.slug])):
        body = client_in.get(url).content.decode()
        assert evil not in body and "&lt;script&gt;" in body


@pytest.mark.parametrize("data, problem", [
    ({"name": "", "page": "conversations", "query": ""}, "required"),
    ({"name": "x" * 101, "page": "conversations", "query": ""}, "at most 100"),
    ({"name": "bad", "page": "conversations", "query": "since=2026-13-45"}, "not valid"),
    ({"name": "bad", "page": "conversations", "query": "sort=drop+table"}, "not valid"),
    ({"name": "bad", "page": "elsewhere", "query": ""}, "valid choice"),
    ({"name": "bad", "page": "conversations", "query": "q=" + "x" * 3000}, "at most 2000"),
    ({"name": "bad", "page": "conversations", "query": "q=" + "华" * 190 + "&user=" + "东" * 190}, "too long"),
])
def test_it_refuses_bad_input_with_400(client_in, project, data, problem):
    response = client_in.post(views_url(project), data)
    assert response.status_code == 400 and problem in response.content.decode()
    assert not SavedView.objects.exists()


def test_it_refuses_a_second_view_of_the_same_name(client_in, project):
    save(client_in, project, name="dup")
    response = save(client_in, project, name="dup")
    assert response.status_code == 400 and "already have a view named" in response.content.decode()
    assert SavedView.objects.count() == 1


def test_it_keeps_the_list_query_count_flat(client_in, project, member, django_assert_max_num_queries):
    for i in range(30):
        SavedView.objects.create(project=project, owner=member, name=f"v{i}", shared=i % 2 == 0)
    with django_assert_max_num_queries(5):
        assert client_in.get(views_url(project)).status_code == 200
