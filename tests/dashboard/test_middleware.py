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
