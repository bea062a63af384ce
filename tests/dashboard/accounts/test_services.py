"""Projects, members and API keys: creation, revocation, who sees what."""

from __future__ import annotations

import pytest

from dashboard.accounts.keys import KEY_PATTERN, hash_key
from dashboard.accounts.models import ApiKey, Membership
from dashboard.accounts.selectors import project_for_user, projects_for_user
from dashboard.accounts.services import apikey_create, apikey_revoke, membership_add, project_create

pytestmark = pytest.mark.django_db


def test_it_makes_unique_slugs_and_an_owner(user):
    first = project_create(name="Sales Agent", owner=user)
    second = project_create(name="Sales agent")
    assert (first.slug, second.slug) == ("sales-agent", "sales-agent-2")
    assert Membership.objects.get(project=first).role == "owner"
    with pytest.raises(ValueError):
        project_create(name="   ")


def test_it_stores_only_the_hash_of_a_key_and_shows_it_once(project):
    key, text = apikey_create(project=project, name="ci")
    assert KEY_PATTERN.match(text)
    assert text.startswith(f"po_{key.prefix}_")
    assert key.hash == hash_key(text) and text not in str(ApiKey.objects.values().get())


def test_it_revokes_a_key_once(project):
    key, _ = apikey_create(project=project)
    first = apikey_revoke(key=key).revoked_at
    assert apikey_revoke(key=ApiKey.objects.get(pk=key.pk)).revoked_at == first


def test_it_shows_users_only_their_projects(user, other_user, project, other_project, django_user_model):
    from django.contrib.auth.models import AnonymousUser
    from django.http import Http404

    assert list(projects_for_user(user)) == [project]
    assert list(projects_for_user(AnonymousUser())) == []
    with pytest.raises(Http404):
        project_for_user(user, other_project.slug)
    membership_add(project=other_project, user=user)
    assert project_for_user(user, other_project.slug) == other_project
    user.is_active = False
    assert list(projects_for_user(user)) == []
