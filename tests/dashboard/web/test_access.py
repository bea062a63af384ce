"""Login everywhere, the project switcher, and 404 for another project's pages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.dashboard.web.pages_factories import PASSWORD, add_artifact, add_span, full_conversation

pytestmark = pytest.mark.django_db

PROJECT_PAGES = ["web:overview", "web:conversations", "web:conversation_rows", "web:tools", "web:artifacts", "web:keys",
                 "web:compare", "web:saved_views", "web:conversations_export", "web:tools_export"]


@pytest.mark.parametrize("name", PROJECT_PAGES)
def test_it_redirects_anonymous_users_to_login(client, project, name):
    response = client.get(reverse(name, args=[project.slug]))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_it_requires_login_for_home(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_it_logs_in_with_the_login_page(client, member, project):
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert b"csrfmiddlewaretoken" in page.content
    response = client.post("/accounts/login/", {"username": "ana", "password": PASSWORD})
    assert response.status_code == 302
    home = client.get("/")
    assert home.status_code == 302
    assert home["Location"] == reverse("web:overview", args=[project.slug])


def test_it_refuses_a_wrong_password(client, member):
    response = client.post("/accounts/login/", {"username": "ana", "password": "nope"})
    assert response.status_code == 200
    assert b"Please enter a correct username and password" in response.content


def test_it_lists_projects_when_the_user_has_several(client_in, member, project, other_project):
    from dashboard.accounts.services import membership_add

    membership_add(project=other_project, user=member)
    response = client_in.get("/")
    assert response.status_code == 200
    assert b"Agents" in response.content and b"Elsewhere" in response.content


@pytest.mark.parametrize("name", PROJECT_PAGES)
def test_it_answers_404_for_a_project_the_user_is_not_in(client_in, other_project, name):
    assert client_in.get(reverse(name, args=[other_project.slug])).status_code == 404


def test_it_answers_404_for_an_unknown_project(client_in):
    assert client_in.get("/p/no-such-project/").status_code == 404


def test_it_shows_only_the_users_projects_in_the_switcher(client_in, project, other_project):
    response = client_in.get(reverse("web:overview", args=[project.slug]))
    assert response.status_code == 200
    assert b'data-testid="project-switcher"' in response.content
    assert b"Agents" in response.content
    assert b"Elsewhere" not in response.content


def test_it_answers_404_for_another_projects_objects(client_in, project, other_project):
    full_conversation(other_project, "theirs")
    from dashboard.observatory.models import CompressionEvent, Conversation, Round, ToolExecution

    conversation = Conversation.objects.get(project=other_project)
    execution = ToolExecution.objects.filter(project=other_project).first()
    event = CompressionEvent.objects.get(project=other_project)
    round_ = Round.objects.filter(project=other_project).first()
    add_span(other_project, "cd" * 16, "1" * 16, "root")
    artifact = add_artifact(other_project, b'{"a": 1}')
    slug = project.slug  # the user's own project in the URL, another project's object ids
    urls = [
        reverse("web:conversation", args=[slug, conversation.pk]),
        reverse("web:conversation_export", args=[slug, conversation.pk]),
        reverse("web:observation", args=[slug, execution.pk]),
        reverse("web:levels", args=[slug, execution.pk]),
        reverse("web:round_waterfall", args=[slug, round_.pk]),
        reverse("web:compression", args=[slug, event.pk]),
        reverse("web:trace", args=[slug, "cd" * 16]),
        reverse("web:artifact", args=[slug, artifact.artifact_id]),
        reverse("web:artifact_download", args=[slug, artifact.artifact_id]),
        reverse("web:tool", args=[slug, "load_csv"]),
        reverse("web:tool_calls_export", args=[slug, conversation.pk]),
        reverse("web:compare", args=[slug]) + f"?a={conversation.pk}&b={conversation.pk}",
    ]
    for url in urls:
        assert client_in.get(url).status_code == 404, url


@pytest.mark.parametrize(
    "path",
    [
        "/p/agents/traces/XYZ/",
        "/p/agents/traces/" + "a" * 31 + "/",
        "/p/agents/artifacts/artifact_XYZ/",
        "/p/agents/artifacts/../../etc/passwd/",
        "/p/agents/conversations/-1/",
        "/p/agents/conversations/abc/",
    ],
)
def test_it_answers_404_for_malformed_ids(client_in, project, path):
    assert client_in.get(path).status_code == 404
