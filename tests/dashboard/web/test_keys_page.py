"""API keys page: create shows the key once, revoke, owners only."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from dashboard.accounts.keys import hash_key
from dashboard.accounts.models import ApiKey
from dashboard.accounts.services import apikey_create, membership_add

pytestmark = pytest.mark.django_db


def test_it_creates_a_key_and_shows_it_once(client_in, project):
    response = client_in.post(reverse("web:keys", args=[project.slug]), {"name": "ci agent"})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    text = re.search(r'data-testid="new-key">.*?<pre>([^<]+)</pre>', response.content.decode(), re.S).group(1)
    key = ApiKey.objects.get(project=project, name="ci agent")
    assert key.hash == hash_key(text) and text not in key.hash
    again = client_in.get(reverse("web:keys", args=[project.slug])).content.decode()
    assert text not in again and "ci agent" in again


def test_it_revokes_a_key(client_in, project):
    key, _ = apikey_create(project=project, name="old")
    response = client_in.post(reverse("web:key_revoke", args=[project.slug, key.pk]))
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert client_in.get(reverse("web:key_revoke", args=[project.slug, key.pk])).status_code == 405


def test_it_lets_only_owners_change_keys(client, project, stranger):
    membership_add(project=project, user=stranger, role="viewer")
    key, _ = apikey_create(project=project)
    client.force_login(stranger)
    page = client.get(reverse("web:keys", args=[project.slug])).content.decode()
    assert "Create key" not in page and "Revoke" not in page
    assert client.post(reverse("web:keys", args=[project.slug]), {"name": "x"}).status_code == 404
    assert client.post(reverse("web:key_revoke", args=[project.slug, key.pk])).status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None and ApiKey.objects.filter(project=project).count() == 1


def test_it_refuses_another_projects_key(client_in, project, other_project):
    key, _ = apikey_create(project=other_project)
    assert client_in.post(reverse("web:key_revoke", args=[project.slug, key.pk])).status_code == 404
    assert client_in.post(reverse("web:key_revoke", args=[other_project.slug, key.pk])).status_code == 404


@pytest.mark.parametrize("name", ["", "x" * 101])
def test_it_refuses_a_bad_name(client_in, project, name):
    response = client_in.post(reverse("web:keys", args=[project.slug]), {"name": name})
    assert response.status_code == 400
    assert not ApiKey.objects.filter(project=project).exists()


def test_it_escapes_key_names(client_in, project):
    client_in.post(reverse("web:keys", args=[project.slug]), {"name": "<script>k()</script>"})
    body = client_in.get(reverse("web:keys", args=[project.slug])).content.decode()
    assert "<script>k()" not in body and "&lt;script&gt;k()&lt;/script&gt;" in body
