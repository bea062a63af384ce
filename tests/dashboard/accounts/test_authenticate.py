"""API key authentication for ingest (dashboard.ingest.common.authenticate)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone

from dashboard.accounts.models import ApiKey
from dashboard.accounts.services import apikey_create, apikey_revoke
from dashboard.ingest.common import IngestError, authenticate

pytestmark = pytest.mark.django_db


def request_with(header: str | None):
    extra = {"HTTP_AUTHORIZATION": header} if header is not None else {}
    return RequestFactory().post("/api/v1/records", **extra)


def test_it_returns_the_project_of_a_valid_key(project, api_key):
    assert authenticate(request_with(f"Bearer {api_key}")) == project
    assert authenticate(request_with(f"bearer   {api_key}  ")) == project


@pytest.mark.parametrize(
    "header, message",
    [(None, "missing API key"), ("", "missing API key"), ("Bearer", "missing API key"),
     ("Token abc", "missing API key"), ("Bearer po_short_x", "invalid API key"),
     ("Bearer " + "x" * 5000, "invalid API key"), ("Bearer po_0123456789abcdef_" + "A" * 43, "invalid API key"),
     ("Bearer po_0123456789abcdef_../../etc/passwd", "invalid API key")],
)
def test_it_refuses_missing_and_malformed_keys(header, message, db):
    with pytest.raises(IngestError) as caught:
        authenticate(request_with(header))
    assert (caught.value.status, caught.value.message) == (401, message)


def test_it_refuses_a_key_with_the_right_prefix_and_a_wrong_secret(project, api_key):
    forged = api_key[:-4] + ("AAAA" if not api_key.endswith("AAAA") else "BBBB")
    with pytest.raises(IngestError, match="invalid API key"):
        authenticate(request_with(f"Bearer {forged}"))


def test_it_refuses_a_revoked_key(project):
    key, text = apikey_create(project=project)
    apikey_revoke(key=key)
    with pytest.raises(IngestError, match="revoked API key"):
        authenticate(request_with(f"Bearer {text}"))


def test_it_writes_last_used_at_at_most_once_a_minute(project, api_key, django_assert_num_queries):
    with django_assert_num_queries(2):  # lookup + update
        authenticate(request_with(f"Bearer {api_key}"))
    with django_assert_num_queries(1):  # lookup only
        authenticate(request_with(f"Bearer {api_key}"))
    ApiKey.objects.update(last_used_at=timezone.now() - timedelta(minutes=2))
    with django_assert_num_queries(2):
        authenticate(request_with(f"Bearer {api_key}"))


def test_it_refuses_a_key_revoked_after_it_was_used(project):
    key, text = apikey_create(project=project)
    assert authenticate(request_with(f"Bearer {text}")) == project
    apikey_revoke(key=key)
    with pytest.raises(IngestError, match="revoked API key"):
        authenticate(request_with(f"Bearer {text}"))


def test_it_refuses_the_key_of_a_deleted_project(project, api_key):
    assert authenticate(request_with(f"Bearer {api_key}")) == project
    project.delete()
    with pytest.raises(IngestError, match="invalid API key"):
        authenticate(request_with(f"Bearer {api_key}"))


def test_it_returns_the_project_as_stored_now(project, api_key):
    authenticate(request_with(f"Bearer {api_key}"))
    type(project).objects.filter(pk=project.pk).update(name="renamed")
    found = authenticate(request_with(f"Bearer {api_key}"))
    assert (found.pk, found.name, found.slug) == (project.pk, "renamed", project.slug)
