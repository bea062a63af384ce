"""The compression diff page."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import compression_record, round_record, store

from dashboard.observatory.models import CompressionEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(project):
    store(project, [round_record("c", 0), compression_record("c", "c-r0")])
    return CompressionEvent.objects.get(project=project)


def page(client, event):
    return client.get(reverse("web:compression", args=[event.project.slug, event.pk]))


def test_it_marks_each_message_with_its_fate(client_in, event):
    response = page(client_in, event)
    assert response.status_code == 200
    body = response.content.decode()
    actions = re.findall(r'<tr class="(\w+)" data-action="\w+">', body)
    assert actions == ["kept", "summarized", "dropped", "truncated"]
    assert "You are a BA agent." in body and "a very long tool log" in body
    assert "long answer (cut)" in body  # the truncated message's new text


def test_it_shows_the_summary_where_it_replaced_messages(client_in, event):
    body = page(client_in, event).content.decode()
    summary = re.search(r'data-testid="summary">([^<]*)<', body).group(1)
    assert summary == "The user asked about the north region."
    assert "replaced messages 1" in body


def test_it_shows_tokens_mode_and_config(client_in, event):
    body = page(client_in, event).content.decode()
    assert re.search(r'data-testid="mode">summarize<', body)
    assert re.search(r'data-testid="tokens">7,000 → 450<', body)
    assert "1 kept · 1 dropped · 1 truncated · 1 summarised" in body
    config = re.search(r'data-testid="config">(.*?)</table>', body, re.S).group(1)
    assert "threshold_ratio" in config and "0.8" in config and "target_ratio" in config


def test_it_shows_stored_data_it_cannot_read_as_a_diff(client_in, event):
    CompressionEvent.objects.filter(pk=event.pk).update(result={"mode": "bogus", "<script>": 1})
    response = page(client_in, event)
    assert response.status_code == 200
    body = response.content.decode()
    assert "could not be read as a diff" in body
    assert "<script>" not in body and "&quot;&lt;script&gt;&quot;" in body


def test_it_escapes_message_contents(client_in, project):
    record = compression_record("h", "h-r0")
    record["result"]["changes"][0]["content_before"] = "<script>alert(1)</script>"
    record["result"]["summaries"][0]["text"] = "<img src=x onerror=alert(2)>"
    store(project, [round_record("h", 0), record])
    body = page(client_in, CompressionEvent.objects.get(conversation__external_id="h")).content.decode()
    assert "<script>alert(1)" not in body and "<img src=x" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_it_keeps_the_query_count_flat(client_in, event, django_assert_max_num_queries):
    url = reverse("web:compression", args=[event.project.slug, event.pk])
    with django_assert_max_num_queries(6):
        assert client_in.get(url).status_code == 200
