"""Score configs in the admin: checked (a form error, not a 500), scoped to the staff
user's projects; scores shown read-only with their edit history."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from dashboard.accounts.services import membership_add
from dashboard.judging.models import Score, ScoreConfig
from dashboard.judging.services import Author, scores_store
from pipeline import ScoreRecord

pytestmark = pytest.mark.django_db
ADD = "/admin/judging/scoreconfig/add/"


@pytest.fixture
def staff_client(client, django_user_model, project):
    staff = django_user_model.objects.create_user("staff", password="pw-staff-123456", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="judging"))
    membership_add(project=project, user=staff)
    client.force_login(staff)
    return client


def form(project, **fields):
    return {"project": project.pk, "name": "helpfulness", "kind": "numeric", "min_value": "", "max_value": "",
            "labels": "[]", "negative_labels": "[]", "description": "", **fields}


def test_it_saves_a_sound_config(staff_client, project):
    response = staff_client.post(ADD, form(project, min_value="1", max_value="5", description="1 to 5 stars"))
    assert response.status_code == 302, response.content.decode()[:2000]
    config = ScoreConfig.objects.get(project=project)
    assert (config.kind, config.min_value, config.max_value) == ("numeric", 1.0, 5.0)


@pytest.mark.parametrize("fields, words", [
    (dict(min_value="5", max_value="1"), "the highest value is below the lowest"),
    (dict(kind="categorical"), "a categorical score needs its labels"),
    (dict(kind="categorical", labels='["good", "bad"]', negative_labels='["awful"]'),
     "negative labels must be among the labels"),
    (dict(kind="boolean", labels='["yes"]'), "only a categorical score has labels"),
    (dict(kind="categorical", labels='{"a": 1}'), "a list of labels"),
])
def test_it_answers_a_senseless_config_with_a_form_error(staff_client, project, fields, words):
    response = staff_client.post(ADD, form(project, **fields))
    assert response.status_code == 200
    assert words in response.content.decode()
    assert not ScoreConfig.objects.exists()


def test_it_refuses_a_second_config_of_the_same_name(staff_client, project):
    ScoreConfig.objects.create(project=project, name="helpfulness")
    response = staff_client.post(ADD, form(project))
    assert response.status_code == 200 and ScoreConfig.objects.count() == 1


def test_staff_see_and_pick_only_their_projects(staff_client, project, other_project):
    ScoreConfig.objects.create(project=other_project, name="secret-metric")
    ScoreConfig.objects.create(project=project, name="mine")
    listing = staff_client.get("/admin/judging/scoreconfig/").content.decode()
    assert "mine" in listing and "secret-metric" not in listing
    response = staff_client.post(ADD, form(other_project, name="sneaky"))
    assert response.status_code == 200 and not ScoreConfig.objects.filter(name="sneaky").exists()
    other = ScoreConfig.objects.get(name="secret-metric")
    assert staff_client.get(f"/admin/judging/scoreconfig/{other.pk}/change/").status_code in (302, 404)


def test_it_shows_a_score_with_its_edits_escaped(staff_client, project, member):
    record = dict(score_id="s", name="tone", value=1, conversation_id="c")
    scores_store(project=project, author=Author.of_key(None), scores=[ScoreRecord(**record)])
    scores_store(project=project, author=Author.of_user(member),
                 scores=[ScoreRecord(**{**record, "value": 0, "comment": "<script>alert(1)</script>"})])
    page = staff_client.get(f"/admin/judging/score/{Score.objects.get().pk}/change/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "ana" in page
