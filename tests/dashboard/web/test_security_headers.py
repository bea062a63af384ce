"""CSP, X-Frame-Options, CSRF on forms, and no inline script on any page."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import add_artifact, add_span, full_conversation

from dashboard.observatory.models import CompressionEvent, Conversation, ToolExecution

pytestmark = pytest.mark.django_db


@pytest.fixture
def pages(project):
    full_conversation(project, "c", trace_id="ab" * 16)
    add_span(project, "ab" * 16, "1" * 16, "root")
    artifact = add_artifact(project, b'{"a": 1}')
    conversation = Conversation.objects.get(project=project)
    execution = ToolExecution.objects.filter(project=project).first()
    event = CompressionEvent.objects.get(project=project)
    s = project.slug
    return [
        reverse("web:overview", args=[s]),
        reverse("web:conversations", args=[s]),
        reverse("web:conversation", args=[s, conversation.pk]),
        reverse("web:tools", args=[s]),
        reverse("web:tool", args=[s, execution.tool_name]),
        reverse("web:levels", args=[s, execution.pk]),
        reverse("web:compression", args=[s, event.pk]),
        reverse("web:artifacts", args=[s]),
        reverse("web:artifact", args=[s, artifact.artifact_id]),
        reverse("web:trace", args=[s, "ab" * 16]),
        reverse("web:keys", args=[s]),
    ]


def test_it_sends_a_strict_csp_on_every_page(client_in, pages):
    for url in pages:
        response = client_in.get(url)
        assert response.status_code == 200, url
        csp = response["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "default-src 'self'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "frame-ancestors 'none'" in csp
        assert response["X-Frame-Options"] == "DENY"
        assert response["X-Content-Type-Options"] == "nosniff"


def test_it_has_no_inline_script_or_style_on_any_page(client_in, pages):
    for url in pages:
        body = client_in.get(url).content.decode()
        for tag in re.findall(r"<script\b[^>]*>", body):
            # Only external scripts or JSON data blocks (json_script), never code.
            assert 'src="/static/' in tag or 'type="application/json"' in tag, (url, tag)
        assert not re.search(r"\son[a-z]+\s*=", body), url  # no onclick= etc.
        assert "style=" not in body, url
        assert "<style" not in body, url
        assert "javascript:" not in body, url


def test_it_sends_the_csp_on_the_login_page_and_errors(client, client_in, project):
    assert "script-src 'self'" in client.get("/accounts/login/")["Content-Security-Policy"]
    assert "script-src 'self'" in client_in.get("/p/nope/")["Content-Security-Policy"]


def test_it_serves_htmx_and_the_chart_library_from_static(client_in, pages):
    body = client_in.get(pages[2]).content.decode()
    assert 'src="/static/django_htmx/htmx-2.min.js"' in body
    assert 'src="/static/vendor/chartjs/chart.umd.min.js"' in body
    assert "cdn" not in body.lower()


def test_it_puts_a_csrf_token_in_every_post_form(client_in, pages):
    for url in pages:
        body = client_in.get(url).content.decode()
        for form in re.findall(r'<form[^>]*method="post"[^>]*>(.*?)</form>', body, re.S):
            assert "csrfmiddlewaretoken" in form, url


def test_it_refuses_a_post_without_csrf(project, member):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(member)
    response = strict.post(reverse("web:keys", args=[project.slug]), {"name": "k"})
    assert response.status_code == 403
