"""The tuning admin: profiles validated by the pipeline, one active per project, the
compression preview, project scoping for non-superusers, and what agents fetch."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from tests.dashboard.web.pages_factories import message_record, store

from dashboard.accounts.services import apikey_create, membership_add
from dashboard.tuning.models import CompressionProfile, EncoderRule, ToolOutputPolicy
from dashboard.tuning.services import effective_config

pytestmark = pytest.mark.django_db
ADD = "/admin/tuning/compressionprofile/add/"


@pytest.fixture
def admin_client(client, django_user_model, project):
    admin = django_user_model.objects.create_superuser("root", password="pw-root-123456")
    client.force_login(admin)
    return client


def profile_form(project, config, **extra):
    return {"project": project.pk, "name": "tight", "config": json.dumps(config), **extra}


@pytest.fixture
def long_conversation(project):
    """Messages long enough that a small target forces compression."""
    records = [message_record("talk", 0, "system", "You are a BA agent.")]
    for i in range(1, 13):
        role = "user" if i % 2 else "assistant"
        records.append(message_record("talk", i, role, f"message {i} " + "details about north sales " * 30))
    store(project, records)
    return "talk"


def test_it_saves_a_valid_profile_and_agents_get_it(admin_client, project):
    response = admin_client.post(ADD, profile_form(project, {"strategy": "truncate", "threshold_ratio": 0.7,
                                                             "target_ratio": 0.4}, is_active="on"))
    assert response.status_code == 302, response.content.decode()[:2000]
    profile = CompressionProfile.objects.get(project=project)
    assert profile.is_active
    assert effective_config(project=project).compression == {"strategy": "truncate", "threshold_ratio": 0.7,
                                                              "target_ratio": 0.4}
    _, key = apikey_create(project=project)
    served = admin_client.get("/api/v1/config", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert served.status_code == 200
    assert served.json()["compression"]["strategy"] == "truncate"


@pytest.mark.parametrize(
    "config, problem",
    [
        ({"threshold_ratio": 2}, "threshold_ratio"),
        ({"strategy": "shred"}, "strategy"),
        ({"no_such_field": 1}, "no_such_field"),
        ({"target_ratio": 0.9, "threshold_ratio": 0.8}, "target_ratio"),
    ],
)
def test_it_refuses_a_config_the_pipeline_refuses(admin_client, project, config, problem):
    response = admin_client.post(ADD, profile_form(project, config))
    assert response.status_code == 200
    assert problem in response.content.decode()
    assert not CompressionProfile.objects.exists()


def test_it_refuses_a_config_that_is_not_an_object(admin_client, project):
    response = admin_client.post(ADD, {"project": project.pk, "name": "x", "config": "[1, 2]"})
    assert response.status_code == 200
    assert not CompressionProfile.objects.exists()


def test_it_keeps_one_active_profile_per_project(admin_client, project):
    first = CompressionProfile.objects.create(project=project, name="first", config={}, is_active=True)
    response = admin_client.post(ADD, profile_form(project, {"strategy": "extract"}, is_active="on"))
    assert response.status_code == 302
    first.refresh_from_db()
    assert not first.is_active
    assert CompressionProfile.objects.get(project=project, is_active=True).name == "tight"


def test_it_previews_the_edited_config_without_saving(admin_client, project, long_conversation):
    data = profile_form(project, {"strategy": "truncate", "keep_recent": 2}, _preview="Preview",
                        preview_conversation=long_conversation, preview_target_tokens="400")
    response = admin_client.post(ADD, data)
    assert response.status_code == 200
    body = response.content.decode()
    assert 'data-testid="preview-result"' in body
    actions = re.findall(r'data-action="(\w+)"', body)
    assert len(actions) == 13 and "dropped" in actions and actions[0] == "kept"  # the system message stays
    assert "Mode truncate" in body and "Nothing was saved." in body
    assert not CompressionProfile.objects.exists()
    # The edited values stay in the form, ready to be saved.
    assert "keep_recent" in body


def test_it_previews_an_existing_profile(admin_client, project, long_conversation):
    profile = CompressionProfile.objects.create(project=project, name="p", config={})
    url = reverse("admin:tuning_compressionprofile_change", args=[profile.pk])
    data = profile_form(project, {"strategy": "extract"}, name="p", _preview="Preview",
                        preview_conversation=long_conversation, preview_target_tokens="500")
    body = admin_client.post(url, data).content.decode()
    assert 'data-testid="preview-result"' in body and "Mode extract" in body
    profile.refresh_from_db()
    assert profile.config == {}


@pytest.mark.parametrize(
    "extra, problem",
    [
        ({"preview_conversation": "nope"}, "No such conversation in this project."),
        ({"preview_conversation": ""}, "This field is required."),
        ({"preview_conversation": "talk", "preview_target_tokens": "-5"}, "greater than or equal to 1"),
    ],
)
def test_it_explains_a_preview_it_cannot_run(admin_client, project, long_conversation, extra, problem):
    data = profile_form(project, {}, _preview="Preview", **extra)
    body = admin_client.post(ADD, data).content.decode()
    assert problem in body and 'data-testid="preview-result"' not in body


def test_it_does_not_preview_another_projects_conversation(client, django_user_model, project, other_project):
    store(other_project, [message_record("secret", 0, "user", "their data")])
    staff = django_user_model.objects.create_user("staff", password="pw-staff-123456", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__endswith="compressionprofile"))
    membership_add(project=project, user=staff)
    client.force_login(staff)
    data = profile_form(project, {}, _preview="Preview", preview_conversation="secret")
    body = client.post(ADD, data).content.decode()
    assert "their data" not in body and "No such conversation in this project." in body


def test_it_shows_staff_only_their_projects(client, django_user_model, project, other_project):
    staff = django_user_model.objects.create_user("staff", password="pw-staff-123456", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(content_type__app_label="tuning"))
    membership_add(project=project, user=staff)
    mine = CompressionProfile.objects.create(project=project, name="mine-profile", config={})
    theirs = CompressionProfile.objects.create(project=other_project, name="their-profile", config={})
    ToolOutputPolicy.objects.create(project=other_project, tool_name="their_tool")
    EncoderRule.objects.create(project=other_project, pattern="claude", safety_margin=1.2)
    client.force_login(staff)
    listing = client.get("/admin/tuning/compressionprofile/").content.decode()
    assert "mine-profile" in listing and "their-profile" not in listing and "Elsewhere" not in listing
    assert client.get(reverse("admin:tuning_compressionprofile_change", args=[theirs.pk])).status_code == 302
    assert "their_tool" not in client.get("/admin/tuning/tooloutputpolicy/").content.decode()
    assert "claude" not in client.get("/admin/tuning/encoderrule/").content.decode()
    add_form = client.get(ADD).content.decode()
    assert "Agents" in add_form and "Elsewhere" not in add_form
    response = client.post(ADD, profile_form(other_project, {}))
    assert response.status_code == 200  # not a valid choice
    assert not CompressionProfile.objects.filter(project=other_project, name="tight").exists()
    assert mine.pk


def test_it_validates_encoder_rules_with_the_pipeline(admin_client, project):
    response = admin_client.post("/admin/tuning/encoderrule/add/",
                                 {"project": project.pk, "pattern": "claude", "safety_margin": "0.5"})
    assert response.status_code == 200 and not EncoderRule.objects.exists()
    response = admin_client.post("/admin/tuning/encoderrule/add/",
                                 {"project": project.pk, "pattern": "claude", "safety_margin": "1.2"})
    assert response.status_code == 302
    assert effective_config(project=project).encoder_margins["claude"] == 1.2
