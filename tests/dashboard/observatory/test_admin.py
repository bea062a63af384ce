"""Derivation notes in the admin: listed per project, errors shown escaped, retried by action."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from dashboard.observatory.models import DerivationNote

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, user, project, other_project):
    user.is_staff = True
    user.save()
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="observatory",
                                                         codename__endswith="derivationnote"))
    client.force_login(user)
    return client


def test_it_lists_parked_notes_of_the_users_projects_only(staff_client, project, other_project):
    DerivationNote.objects.create(project=project, conversation_ids=[1], parked=True, attempts=5,
                                  last_error="<script>alert(1)</script> mine")
    DerivationNote.objects.create(project=other_project, conversation_ids=[2], last_error="theirs")
    page = staff_client.get("/admin/observatory/derivationnote/").content.decode()
    assert "mine" in page and "theirs" not in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page


def test_it_retries_parked_notes_by_action_and_not_others_projects(staff_client, project, other_project):
    mine = DerivationNote.objects.create(project=project, parked=True, attempts=5)
    theirs = DerivationNote.objects.create(project=other_project, parked=True, attempts=5)
    response = staff_client.post("/admin/observatory/derivationnote/", {
        "action": "retry_now", "_selected_action": [mine.pk, theirs.pk]})
    assert response.status_code == 302
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.parked, mine.attempts) == (False, 0)
    assert theirs.parked  # not in the user's queryset: untouched


def test_it_offers_no_add_or_edit(staff_client, project):
    note = DerivationNote.objects.create(project=project)
    assert staff_client.get("/admin/observatory/derivationnote/add/").status_code == 403
    response = staff_client.post(f"/admin/observatory/derivationnote/{note.pk}/change/", {"parked": "on"})
    assert response.status_code in (302, 403)
    note.refresh_from_db()
    assert not note.parked
