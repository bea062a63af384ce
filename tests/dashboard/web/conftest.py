"""Fixtures for the page tests: a member, their project, a stranger's project."""

from __future__ import annotations

import pytest
from tests.dashboard.web.pages_factories import PASSWORD

from dashboard.accounts.services import project_create


@pytest.fixture
def member(django_user_model):
    return django_user_model.objects.create_user("ana", password=PASSWORD)


@pytest.fixture
def stranger(django_user_model):
    return django_user_model.objects.create_user("bo", password=PASSWORD)


@pytest.fixture
def project(member):
    return project_create(name="Agents", owner=member)


@pytest.fixture
def other_project(stranger):
    return project_create(name="Elsewhere", owner=stranger)


@pytest.fixture
def client_in(client, member):
    client.force_login(member)
    return client


