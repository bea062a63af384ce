"""The admin shows a staff user only the projects they belong to."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from dashboard.accounts.models import ApiKey
from dashboard.accounts.services import apikey_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, user, project, other_project):
    user.is_staff = True
    user.save()
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label__in=["accounts", "tuning"]))
    client.force_login(user)
    return client


def test_it_lists_only_the_users_projects(staff_client, project, other_project):
    page = staff_client.get("/admin/accounts/project/")
    assert page.status_code == 200
    assert project.name in page.content.decode()
    assert other_project.name not in page.content.decode()


def test_it_hides_another_projects_project_page(staff_client, other_project):
    response = staff_client.get(f"/admin/accounts/project/{other_project.pk}/change/")
    assert response.status_code == 302  # Django admin: "doesn't exist", back to the index


def test_it_lists_only_keys_of_the_users_projects(staff_client, project, other_project):
    mine, _ = apikey_create(project=project, name="mine-key")
    theirs, _ = apikey_create(project=other_project, name="their-key")
    page = staff_client.get("/admin/accounts/apikey/").content.decode()
    assert "mine-key" in page and "their-key" not in page
    assert staff_client.get(f"/admin/accounts/apikey/{theirs.pk}/change/").status_code == 302
    assert mine.hash not in staff_client.get(f"/admin/accounts/apikey/{mine.pk}/change/").content.decode()


def test_it_cannot_revoke_another_projects_key_through_the_action(staff_client, project, other_project):
    theirs, _ = apikey_create(project=other_project, name="their-key")
    staff_client.post("/admin/accounts/apikey/", {"action": "revoke", "_selected_action": [theirs.pk]})
    assert ApiKey.objects.get(pk=theirs.pk).revoked_at is None


def test_it_keeps_membership_editing_to_superusers(staff_client, admin_client, project):
    add_row = 'id="memberships-empty"'  # the template row the admin clones to add a member
    assert add_row in admin_client.get(f"/admin/accounts/project/{project.pk}/change/").content.decode()
    assert add_row not in staff_client.get(f"/admin/accounts/project/{project.pk}/change/").content.decode()


def test_it_has_no_admin_for_stored_conversation_data(admin_client):
    assert admin_client.get("/admin/observatory/artifact/").status_code == 404
