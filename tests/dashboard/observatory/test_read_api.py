"""The session-authenticated read API: only the user's projects, 404 otherwise."""

from __future__ import annotations

import hashlib
import io

import pytest

from dashboard.observatory import tasks
from dashboard.observatory.services import artifact_store, records_store
from pipeline import parse_record

pytestmark = pytest.mark.django_db


def store(project, batch):
    outcome = records_store(project=project, records=[parse_record(item) for item in batch])
    tasks.conversation_totals_refresh(sorted(outcome.conversation_ids))
    tasks.tool_rollups_refresh(project.pk, sorted(h.isoformat() for h in outcome.tool_hours))


def test_it_lists_filters_and_pages_conversations(member_client, project, records):
    batch = []
    for i in range(60):
        batch.append(records.round(conversation=f"c{i:02}", model="gpt-4o" if i % 2 else "claude",
                                   status="error" if i % 10 == 0 else "ok"))
    store(project, batch)
    url = f"/api/v1/projects/{project.slug}/conversations"
    first = member_client.get(url).json()
    assert len(first["items"]) == 50 and first["has_next"]
    assert not member_client.get(url, {"page": 2}).json()["has_next"]
    errors = member_client.get(url, {"status": "error"}).json()["items"]
    assert len(errors) == 6 and all(c["has_errors"] for c in errors)
    assert len(member_client.get(url, {"model": "claude", "status": "ok"}).json()["items"]) == 24


def test_it_lists_conversations_in_a_fixed_number_of_queries(member_client, project, records,
                                                            django_assert_max_num_queries):
    store(project, [records.round(conversation=f"c{i}") for i in range(40)])
    with django_assert_max_num_queries(6):  # session, user, project, page
        assert member_client.get(f"/api/v1/projects/{project.slug}/conversations").status_code == 200


def test_it_shows_a_conversation_with_its_rounds_and_tool_calls(member_client, project, records):
    store(project, [records.round(), records.tool_result(round_id="r0"), records.compression()])
    body = member_client.get(f"/api/v1/projects/{project.slug}/conversations/conv-1").json()
    assert body["conversation"]["tool_calls"] == 1
    assert [r["round_id"] for r in body["rounds"]] == ["r0"]
    assert body["tool_executions"][0]["tool_name"] == "query_sales"
    assert body["compressions"][0]["dropped_count"] == 1


def test_it_serves_tool_statistics_from_rollups(member_client, project, records):
    store(project, [records.tool_result(duration_ms=3), records.tool_result(duration_ms=40, success=False)])
    [row] = member_client.get(f"/api/v1/projects/{project.slug}/tools").json()
    assert (row["calls"], row["errors"], row["error_rate"], row["p50_ms"], row["p99_ms"]) == (2, 1, 0.5, 5.0, 50.0)
    assert row["error_types"] == {"timeout": 1}


def test_it_downloads_an_artifact_as_an_attachment(member_client, project):
    data = b"<script>alert(1)</script>"
    artifact_store(project=project, artifact_id="artifact_" + "c" * 16, stream=io.BytesIO(data),
                   sha256=hashlib.sha256(data).hexdigest(), content_type="text/html", max_bytes=1000)
    response = member_client.get(f"/api/v1/projects/{project.slug}/artifacts/artifact_{'c' * 16}/download")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == data
    assert response["Content-Type"] == "text/html"
    assert response["Content-Disposition"].startswith("attachment")
    assert response["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize("path", ["conversations", "conversations/conv-1", "tools",
                                  "artifacts/artifact_cccccccccccccccc/download"])
def test_it_answers_404_for_a_project_the_user_is_not_in(client, other_user, project, records, path):
    store(project, [records.round()])
    client.force_login(other_user)
    response = client.get(f"/api/v1/projects/{project.slug}/{path}")
    assert response.status_code == 404
    assert response.json() == {"error": "not found"}


def test_it_answers_401_without_a_session_and_ignores_api_keys(client, auth, project):
    response = client.get(f"/api/v1/projects/{project.slug}/conversations", **auth)
    assert response.status_code == 401


def test_it_answers_400_to_bad_query_parameters(member_client, project):
    url = f"/api/v1/projects/{project.slug}/conversations"
    for params in ({"page": "0"}, {"page": "x"}, {"status": "weird"}, {"order": "drop table"}):
        response = member_client.get(url, params)
        assert response.status_code == 400 and "error" in response.json()
