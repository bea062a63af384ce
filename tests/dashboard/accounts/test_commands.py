"""createuser, createproject, createapikey."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from dashboard.accounts.keys import hash_key
from dashboard.accounts.models import ApiKey, Membership, Project

pytestmark = pytest.mark.django_db


def run(*args, **env) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_it_creates_a_user_from_a_password_in_the_environment(monkeypatch, django_user_model):
    monkeypatch.setenv("OBSERVATORY_PASSWORD", "s3cret-enough")
    run("createuser", "ana")
    assert django_user_model.objects.get(username="ana").check_password("s3cret-enough")


def test_it_refuses_to_create_a_user_without_a_password(monkeypatch):
    monkeypatch.delenv("OBSERVATORY_PASSWORD", raising=False)
    with pytest.raises(CommandError):
        run("createuser", "ana")


def test_it_creates_a_project_with_members(user, other_user):
    run("createproject", "Sales agent", "--member", user.username, "--member", other_user.username)
    project = Project.objects.get(slug="sales-agent")
    assert dict(Membership.objects.filter(project=project).values_list("user__username", "role")) == {
        user.username: "owner", other_user.username: "member"}
    with pytest.raises(CommandError):
        run("createproject", "x", "--member", "nobody")


def test_it_prints_a_new_key_once_and_stores_its_hash(project):
    text = run("createapikey", project.slug, "--name", "ci")
    key = ApiKey.objects.get(name="ci")
    assert key.hash == hash_key(text) and key.project == project
    with pytest.raises(CommandError):
        run("createapikey", "no-such-project")


def test_it_purges_from_the_command_line(project):
    assert "0 spans" in run("purge", "--project", project.slug)
    with pytest.raises(CommandError):
        run("purge", "--project", "nope")
