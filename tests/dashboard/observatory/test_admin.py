"""Derivation notes in the admin: listed per project, errors shown escaped, retried by action.
The broken-database answers of ingest: counted per project, shown to its staff only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from dashboard.observatory.models import DerivationNote, IngestDatabaseFault, IngestTransport

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


# --- broken-database answers of ingest -------------------------------------------------

FAULTS = "/admin/observatory/ingestdatabasefault/"


@pytest.fixture
def fault_viewer(client, user):
    user.is_staff = True
    user.save()
    user.user_permissions.add(Permission.objects.get(codename="view_ingestdatabasefault"))
    client.force_login(user)
    return client


def test_it_shows_the_broken_database_answers_of_the_users_projects_only(fault_viewer, project, other_project):
    today = timezone.now().date()
    IngestDatabaseFault.objects.create(project=project, day=today, transport=IngestTransport.OTLP_GRPC, count=7,
                                       last_error="psycopg.errors.UndefinedTable")
    IngestDatabaseFault.objects.create(project=other_project, day=today, transport=IngestTransport.RECORDS, count=3)
    IngestDatabaseFault.objects.create(project=None, day=today, transport=IngestTransport.RECORDS, count=2)
    response = fault_viewer.get(FAULTS)
    assert response.status_code == 200
    assert [(row.project, row.transport, row.count) for row in response.context["cl"].result_list] == [
        (project, IngestTransport.OTLP_GRPC, 7)]  # not another project's, nor the one without a project
    page = response.content.decode()
    assert "Agents" in page and ">7<" in page and "UndefinedTable" in page and "Elsewhere" not in page
    assert fault_viewer.get(f"{FAULTS}add/").status_code == 403


def test_a_superuser_sees_the_answers_of_every_project_and_of_no_project(admin_client, project):
    IngestDatabaseFault.objects.create(project=None, day=timezone.now().date(), transport=IngestTransport.RECORDS,
                                       count=2)
    response = admin_client.get(FAULTS)
    assert [(row.project, row.count) for row in response.context["cl"].result_list] == [(None, 2)]


def test_an_anonymous_user_is_sent_to_log_in_and_sees_no_count(client, project):
    IngestDatabaseFault.objects.create(project=project, day=timezone.now().date(),
                                       transport=IngestTransport.OTLP_HTTP, count=5)
    response = client.get(FAULTS)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert b"OTLP/HTTP" not in response.content
