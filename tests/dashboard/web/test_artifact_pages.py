"""Artifacts: list, preview (JSON / CSV / text / binary, cut when large), download."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import add_artifact, store, tool_record

from dashboard.web.selectors import artifacts as artifact_selectors

pytestmark = pytest.mark.django_db


def detail(client, artifact):
    return client.get(reverse("web:artifact", args=[artifact.project.slug, artifact.artifact_id]))


def test_it_lists_artifacts_with_tool_and_conversation(client_in, project):
    artifact = add_artifact(project, b'{"rows": [1, 2, 3]}')
    store(project, [tool_record("conv-a", tool="export_table", artifact_id=artifact.artifact_id)])
    response = client_in.get(reverse("web:artifacts", args=[project.slug]))
    assert response.status_code == 200
    body = response.content.decode()
    assert artifact.artifact_id in body and "export_table" in body and "application/json" in body
    assert reverse("web:artifact_download", args=[project.slug, artifact.artifact_id]) in body


def test_it_pages_the_list(client_in, project, monkeypatch):
    monkeypatch.setattr(artifact_selectors, "PAGE_SIZE", 2)
    ids = [add_artifact(project, f"{i}".encode(), "text/plain").artifact_id for i in range(5)]
    first = client_in.get(reverse("web:artifacts", args=[project.slug])).content.decode()
    assert ids[4] in first and ids[3] in first and ids[2] not in first
    after = re.search(r'href="\?before=(\d+)" rel="next"', first).group(1)
    second = client_in.get(reverse("web:artifacts", args=[project.slug]) + f"?before={after}").content.decode()
    assert ids[2] in second and ids[1] in second and ids[4] not in second
    assert client_in.get(reverse("web:artifacts", args=[project.slug]) + "?before=x").status_code == 404


def test_it_pretty_prints_json(client_in, project):
    artifact = add_artifact(project, json.dumps({"b": [1, 2], "a": "东部"}).encode())
    body = detail(client_in, artifact).content.decode()
    preview = re.search(r'<pre data-testid="preview">(.*?)</pre>', body, re.S).group(1)
    assert preview == '{\n  &quot;b&quot;: [\n    1,\n    2\n  ],\n  &quot;a&quot;: &quot;东部&quot;\n}'


def test_it_shows_csv_as_a_table(client_in, project):
    artifact = add_artifact(project, b"region,total\nnorth,12\nsouth,7\n", "text/csv")
    body = detail(client_in, artifact).content.decode()
    assert "<th>region</th><th>total</th>" in body
    assert "<td>north</td><td>12</td>" in body and "<td>south</td><td>7</td>" in body


def test_it_cuts_large_files_with_a_notice(client_in, project, monkeypatch):
    monkeypatch.setattr(artifact_selectors, "PREVIEW_BYTES", 64)
    artifact = add_artifact(project, b"x" * 1000, "text/plain")
    body = detail(client_in, artifact).content.decode()
    assert 'data-testid="cut-notice"' in body
    assert "x" * 64 in body and "x" * 65 not in body


def test_it_cuts_large_csv_by_rows(client_in, project, monkeypatch):
    monkeypatch.setattr(artifact_selectors, "CSV_PREVIEW_ROWS", 3)
    artifact = add_artifact(project, "".join(f"{i},v{i}\n" for i in range(50)).encode(), "text/csv")
    body = detail(client_in, artifact).content.decode()
    assert 'data-testid="cut-notice"' in body and "<td>2</td>" in body and "<td>3</td>" not in body


def test_it_does_not_preview_binary(client_in, project):
    artifact = add_artifact(project, b"\x89PNG\r\n\x1a\n\x00\x00\x00", "image/png")
    assert b"Binary content: no preview." in detail(client_in, artifact).content


def test_it_escapes_hostile_content(client_in, project):
    artifact = add_artifact(project, b"<script>alert(1)</script>", "text/html")
    body = detail(client_in, artifact).content.decode()
    assert "<script>alert(1)" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_it_downloads_with_type_and_disposition(client_in, project):
    data = b"region,total\nnorth,12\n"
    artifact = add_artifact(project, data, "text/csv")
    response = client_in.get(reverse("web:artifact_download", args=[project.slug, artifact.artifact_id]))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv"
    assert response["Content-Disposition"] == f'attachment; filename="{artifact.artifact_id}.csv"'
    assert response.streaming
    assert b"".join(response.streaming_content) == data


def test_it_downloads_a_malformed_type_as_octet_stream(client_in, project):
    artifact = add_artifact(project, b"abc", 'text/html"; evil=1\r\nX-Injected: 1')
    response = client_in.get(reverse("web:artifact_download", args=[project.slug, artifact.artifact_id]))
    assert response["Content-Type"] == "application/octet-stream"
    assert "X-Injected" not in response.headers
    assert response["Content-Disposition"].endswith('.bin"')


def test_it_never_shows_the_storage_path(client_in, project, settings):
    artifact = add_artifact(project, b'{"a": 1}')
    stored_name = artifact.file.name
    location = str(settings.STORAGES["artifacts"]["OPTIONS"]["location"])
    for url in (reverse("web:artifacts", args=[project.slug]),
                reverse("web:artifact", args=[project.slug, artifact.artifact_id])):
        body = client_in.get(url).content.decode()
        assert stored_name not in body and location not in body
    response = client_in.get(reverse("web:artifact_download", args=[project.slug, artifact.artifact_id]))
    assert stored_name not in response["Content-Disposition"]


def test_it_says_so_when_the_file_is_gone(client_in, project):
    artifact = add_artifact(project, b"data", "text/plain")
    artifact.file.storage.delete(artifact.file.name)
    assert b"not available any more" in detail(client_in, artifact).content
    response = client_in.get(reverse("web:artifact_download", args=[project.slug, artifact.artifact_id]))
    assert response.status_code == 404


def test_it_answers_404_for_unknown_artifacts(client_in, project):
    url = reverse("web:artifact", args=[project.slug, "artifact_" + "0" * 32])
    assert client_in.get(url).status_code == 404


def test_it_keeps_the_list_query_count_flat(client_in, project, django_assert_max_num_queries):
    for i in range(10):
        add_artifact(project, f"{i}".encode(), "text/plain")
    url = reverse("web:artifacts", args=[project.slug])
    with django_assert_max_num_queries(6):
        assert client_in.get(url).status_code == 200


def test_it_names_the_tool_that_produced_an_artifact_and_lists_its_readers(client_in, project):
    """Artifacts are content-addressed: a tool that reads one back (file_reader) gets
    the same artifact id in its result. The artifact is the producer's
    (query_database, the first to name it), whatever the order the records arrive
    in; the readers are listed on its page."""
    from datetime import timedelta

    from tests.dashboard.web.pages_factories import HOUR

    from dashboard.observatory.models import Artifact, ToolExecution

    artifact = add_artifact(project, b'[{"region": "east", "total": 39}]')
    reader = tool_record("conv-a", tool="file_reader", at=HOUR + timedelta(minutes=2),
                         artifact_id=artifact.artifact_id, parameters={"name": artifact.artifact_id})
    store(project, [reader])  # the reader's record first: its batch came before the producer's
    producer = tool_record("conv-a", tool="query_database", at=HOUR + timedelta(minutes=1),
                           artifact_id=artifact.artifact_id, parameters={"sql": "select region, total from sales"})
    only_arguments = tool_record("conv-a", tool="summarise", at=HOUR + timedelta(minutes=3),
                                 parameters={"artifact": artifact.artifact_id})
    store(project, [producer, only_arguments])
    first = ToolExecution.objects.get(tool_name="query_database")
    body = client_in.get(reverse("web:artifacts", args=[project.slug])).content.decode()
    cell = re.search(r'<td data-field="producer">(.*?)</td>', body, re.S).group(1)
    assert cell == "<code>query_database</code>"
    page = detail(client_in, artifact).content.decode()
    assert "<code>query_database</code>" in re.search(r'data-testid="producer">(.*?)</td>', page, re.S).group(1)
    readers = re.search(r'data-testid="readers">(.*?)</td>', page, re.S).group(1)
    assert re.findall(r"<code>(\w+)</code>", readers) == ["file_reader", "summarise"]
    assert f"#exec-{first.pk}" in page  # the conversation link opens at the producer

    # the link pass names the producer too, when both are there to choose from
    Artifact.objects.filter(pk=artifact.pk).update(tool_execution=None)
    from dashboard.observatory.derive.passes import links

    links.links_refresh(project_id=project.pk, artifact_ids=[artifact.artifact_id])
    assert Artifact.objects.get(pk=artifact.pk).tool_execution_id == first.pk


def test_it_lists_no_reader_of_another_project(client_in, project, other_project):
    artifact = add_artifact(project, b"[1]")
    store(project, [tool_record("conv-a", tool="query_database", artifact_id=artifact.artifact_id)])
    store(other_project, [tool_record("conv-a", tool="file_reader", artifact_id=artifact.artifact_id,
                                      parameters={"name": artifact.artifact_id})])
    page = detail(client_in, artifact).content.decode()
    assert 'data-testid="readers"' not in page and "file_reader" not in page
    assert client_in.get(reverse("web:artifact", args=[other_project.slug, artifact.artifact_id])).status_code == 404
