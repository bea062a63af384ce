"""NUL bytes in URLs are refused before any view runs (PostgreSQL would raise on them)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("url", [
    "/p/{slug}/conversations/%00/",
    "/p/{slug}/conversations/?q=%00",
    "/p/{slug}/conversations/?user=a%00b",
    "/p/{slug}/tools/%00x/",
    "/api/v1/projects/{slug}/conversations/?q=%00",
    "/api/v1/projects/{slug}/artifacts/%00/download",
])
def test_it_answers_400_to_a_nul_byte_anywhere_in_the_url(member_client, project, url):
    response = member_client.get(url.format(slug=project.slug))
    assert response.status_code == 400
    assert b"NUL" in response.content


def test_it_lets_ordinary_urls_through(member_client, project):
    assert member_client.get(f"/p/{project.slug}/conversations/?q=100%25").status_code == 200


def test_it_refuses_nul_before_authentication_on_ingest(client):
    assert client.post("/v1/traces?x=%00", b"", content_type="application/x-protobuf").status_code == 400


# --- the agents' endpoints skip the pages' middleware --------------------------------


def test_it_serves_ingest_without_session_or_csrf(client, auth, settings):
    settings.SECURE_CONTENT_TYPE_NOSNIFF = True
    response = client.post("/api/v1/records", {"records": []}, content_type="application/json", **auth)
    assert response.status_code == 200
    assert "sessionid" not in response.cookies and "csrftoken" not in response.cookies
    assert response.headers["X-Content-Type-Options"] == "nosniff"  # SecurityMiddleware still runs


def test_it_keeps_the_pages_middleware_for_pages(member_client, project):
    response = member_client.get(f"/p/{project.slug}/conversations/")
    assert "Content-Security-Policy" in response.headers


def test_it_keeps_the_session_api_under_the_full_stack(member_client, project):
    # The read API is reached with a log-in, not a key: it must not take the fast path.
    response = member_client.get(f"/api/v1/projects/{project.slug}/conversations")
    assert response.status_code == 200


@pytest.mark.parametrize("path", ["/v1/nothing", "/v1/", "/api/v1/recordsx", "/v1/traces/../admin/"])
def test_it_answers_404_to_unknown_paths_under_an_ingest_prefix(client, auth, path):
    response = client.post(path, b"{}", content_type="application/json", **auth)
    assert response.status_code == 404
