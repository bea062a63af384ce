"""API key authentication for ingest (dashboard.ingest.common.authenticate)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone

from dashboard.accounts.keys import hash_key
from dashboard.accounts.models import ApiKey
from dashboard.accounts.services import apikey_create, apikey_revoke
from dashboard.ingest import common
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


def test_it_keeps_a_renamed_project_s_key_valid(project, api_key):
    """A known key's project is held by this process as first read: ingest uses
    only its id, so renaming the project changes nothing for its keys."""
    authenticate(request_with(f"Bearer {api_key}"))
    type(project).objects.filter(pk=project.pk).update(name="renamed")
    assert authenticate(request_with(f"Bearer {api_key}")).pk == project.pk


# --- the per-process cache of known keys ------------------------------------------


def test_it_checks_a_known_key_with_one_query(project, api_key, django_assert_num_queries):
    authenticate(request_with(f"Bearer {api_key}"))
    with django_assert_num_queries(1) as captured:
        assert authenticate(request_with(f"Bearer {api_key}")) == project
    # the check by primary key, not the lookup by prefix with its join
    assert "JOIN" not in captured.captured_queries[0]["sql"].upper()


def test_it_refuses_a_known_key_revoked_by_another_connection(project, api_key):
    """The revocation is written as another process would (its own UPDATE); the
    very next request with the cached key is refused."""
    assert authenticate(request_with(f"Bearer {api_key}")) == project
    ApiKey.objects.filter(project=project).update(revoked_at=timezone.now())
    for _ in range(2):  # and stays refused (it left the cache)
        with pytest.raises(IngestError, match="revoked API key"):
            authenticate(request_with(f"Bearer {api_key}"))
    assert hash_key(api_key) not in common._known_keys


def test_it_takes_a_known_key_again_when_its_revocation_is_undone(project, api_key):
    authenticate(request_with(f"Bearer {api_key}"))
    ApiKey.objects.update(revoked_at=timezone.now())
    with pytest.raises(IngestError, match="revoked API key"):
        authenticate(request_with(f"Bearer {api_key}"))
    ApiKey.objects.update(revoked_at=None)
    assert authenticate(request_with(f"Bearer {api_key}")) == project


def test_it_refuses_a_known_key_whose_row_was_deleted(project, api_key):
    authenticate(request_with(f"Bearer {api_key}"))
    ApiKey.objects.filter(project=project).delete()
    with pytest.raises(IngestError, match="invalid API key"):
        authenticate(request_with(f"Bearer {api_key}"))
    assert hash_key(api_key) not in common._known_keys


def test_it_refuses_a_known_key_whose_hash_changed(project, api_key):
    """A row edited to another key's hash (say, rotated in place) no longer matches
    the text that was cached."""
    authenticate(request_with(f"Bearer {api_key}"))
    ApiKey.objects.filter(project=project).update(hash="0" * 64)
    with pytest.raises(IngestError, match="invalid API key"):
        authenticate(request_with(f"Bearer {api_key}"))


def test_it_refuses_a_known_key_moved_to_another_project(project, other_project, api_key):
    authenticate(request_with(f"Bearer {api_key}"))
    ApiKey.objects.filter(project=project).update(project=other_project)
    with pytest.raises(IngestError, match="invalid API key"):
        authenticate(request_with(f"Bearer {api_key}"))
    assert authenticate(request_with(f"Bearer {api_key}")) == other_project  # looked up afresh


def test_it_gives_each_known_key_its_own_project(project, other_project, api_key):
    _, other_key = apikey_create(project=other_project)
    for _ in range(2):  # first sight, then from the cache
        assert authenticate(request_with(f"Bearer {api_key}")) == project
        assert authenticate(request_with(f"Bearer {other_key}")) == other_project
    # one key's prefix with the other's secret is nobody's key
    forged = api_key[: api_key.rindex("_") + 1] + other_key[other_key.rindex("_") + 1 :]
    with pytest.raises(IngestError, match="invalid API key"):
        authenticate(request_with(f"Bearer {forged}"))
    assert hash_key(forged) not in common._known_keys


def test_it_refuses_a_known_key_after_its_project_is_deleted_and_remembers_nothing_of_it(project, api_key):
    authenticate(request_with(f"Bearer {api_key}"))
    project.delete()
    with pytest.raises(IngestError, match="invalid API key"):
        authenticate(request_with(f"Bearer {api_key}"))
    assert hash_key(api_key) not in common._known_keys


def test_it_never_remembers_refused_keys(project):
    key, text = apikey_create(project=project)
    apikey_revoke(key=key)
    before = dict(common._known_keys)
    for header in (f"Bearer {text}", "Bearer po_0123456789abcdef_" + "A" * 43, "Bearer " + "x" * 5000):
        with pytest.raises(IngestError):
            authenticate(request_with(header))
    assert common._known_keys == before


def test_it_keeps_the_cache_bounded(project, api_key, monkeypatch):
    monkeypatch.setattr(common, "_KNOWN_KEYS_MAX", 2)
    monkeypatch.setattr(common, "_known_keys", {})
    texts = [api_key] + [apikey_create(project=project)[1] for _ in range(4)]
    for text in texts:
        assert authenticate(request_with(f"Bearer {text}")) == project
        assert len(common._known_keys) <= 2
