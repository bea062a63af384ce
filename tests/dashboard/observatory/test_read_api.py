"""The session-authenticated read API: only the user's projects, 404 otherwise.

It reads through the same domain selectors as the pages, so where they decide
something (search, ordering, rounds per page, download type) it answers alike."""

from __future__ import annotations

import hashlib
import io
from datetime import timedelta

import pytest

from dashboard.observatory import selectors, tasks
from dashboard.observatory.models import Artifact, Conversation
from dashboard.observatory.services import artifact_store, records_store
from pipeline import parse_record

pytestmark = pytest.mark.django_db


def store(project, batch):
    outcome = records_store(project=project, records=[parse_record(item) for item in batch])
    tasks.conversation_totals_refresh(sorted(outcome.conversation_ids))
    tasks.tool_rollups_refresh(project.pk, [], sorted(m.isoformat() for m in outcome.tool_minutes))


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
    store(project, [records.round(), records.tool_result(round_id="r0"), records.compression(),
                    records.skill(round_id="r0", chain=["sales-report"])])
    body = member_client.get(f"/api/v1/projects/{project.slug}/conversations/conv-1").json()
    assert body["conversation"]["tool_calls"] == 1
    assert [r["round_id"] for r in body["rounds"]] == ["r0"]
    assert body["tool_executions"][0]["tool_name"] == "query_sales"
    assert body["compressions"][0]["dropped_count"] == 1  # outside any round: still shown
    assert [(a["skill_name"], a["chain"]) for a in body["skill_activations"]] == [("sales-report", ["sales-report"])]


def test_it_serves_tool_statistics_from_rollups(member_client, project, records):
    store(project, [records.tool_result(duration_ms=3), records.tool_result(duration_ms=40, success=False)])
    [row] = member_client.get(f"/api/v1/projects/{project.slug}/tools").json()
    assert (row["calls"], row["errors"], row["error_rate"], row["p50_ms"], row["p99_ms"]) == (2, 1, 0.5, 5.0, 50.0)
    assert row["error_types"] == {"timeout": 1}
    assert row["mean_ms"] == 21.5 and row["tokens_by_level"]["standard"]["count"] == 2


def test_it_serves_the_same_tool_statistics_as_the_tools_page(member_client, project, records):
    store(project, [records.tool_result(tool="a", duration_ms=d) for d in (1, 7, 90, 900_000)]
          + [records.tool_result(tool="b", success=False)])
    api = {row["tool_name"]: row for row in member_client.get(f"/api/v1/projects/{project.slug}/tools").json()}
    for stats in selectors.tool_stats(project):
        row = api[stats.tool_name]
        assert (row["calls"], row["errors"], row["p50_ms"], row["p95_ms"]) == (
            stats.calls, stats.errors, stats.p50, stats.p95)
        assert row["latency_histogram"] == stats.latency_histogram
    assert list(api) == ["a", "b"]  # busiest first


def test_it_bounds_tool_statistics_to_the_range(member_client, project, records):
    store(project, [records.tool_result(tool="old", at=records.now - timedelta(days=3)),
                    records.tool_result(tool="new")])
    url = f"/api/v1/projects/{project.slug}/tools"
    since = (records.now - timedelta(days=1)).isoformat()
    assert [r["tool_name"] for r in member_client.get(url, {"since": since}).json()] == ["new"]
    assert [r["tool_name"] for r in member_client.get(url, {"until": since}).json()] == ["old"]
    assert member_client.get(url, {"since": "yesterday"}).status_code == 400


def test_it_searches_round_and_message_texts_like_the_pages(member_client, project, records):
    store(project, [records.round(conversation="plain", user_message="nothing here"),
                    records.round(conversation="zoo", user_message="hello"),
                    records.message(conversation="zoo", content="the rare zebra")])
    url = f"/api/v1/projects/{project.slug}/conversations"
    assert [c["external_id"] for c in member_client.get(url, {"q": "ZEBRA"}).json()["items"]] == ["zoo"]
    assert [c["external_id"] for c in member_client.get(url, {"q": "plain"}).json()["items"]] == ["plain"]
    assert member_client.get(url, {"q": "%' OR 1=1 --"}).json()["items"] == []
    assert member_client.get(url, {"q": "x" * 201}).status_code == 400


def test_it_filters_by_tool_and_by_having_no_errors(member_client, project, records):
    store(project, [records.tool_result(conversation="clean", tool="load_csv"),
                    records.tool_result(conversation="broken", tool="query_sales", success=False)])
    url = f"/api/v1/projects/{project.slug}/conversations"
    assert [c["external_id"] for c in member_client.get(url, {"tool": "load_csv"}).json()["items"]] == ["clean"]
    assert [c["external_id"] for c in member_client.get(url, {"has_errors": "false"}).json()["items"]] == ["clean"]
    assert [c["external_id"] for c in member_client.get(url, {"has_errors": "true"}).json()["items"]] == ["broken"]
    assert member_client.get(url, {"tool": "t" * 201}).status_code == 400


@pytest.mark.parametrize("order", ["recent", "oldest", "started", "tokens", "errors"])
def test_it_pages_every_order_without_losing_or_repeating_a_row(member_client, project, records, order):
    """Many ties (same errors, same times): ids break them, so offset pages stay apart."""
    Conversation.objects.bulk_create([
        Conversation(project=project, external_id=f"c{i:03}", errors=i % 2, input_tokens=i % 3,
                     started_at=records.now, last_activity_at=records.now + timedelta(seconds=i % 4))
        for i in range(75)
    ])
    url = f"/api/v1/projects/{project.slug}/conversations"
    first = member_client.get(url, {"order": order}).json()
    second = member_client.get(url, {"order": order, "page": 2}).json()
    seen = [c["external_id"] for c in first["items"] + second["items"]]
    assert first["has_next"] and not second["has_next"]
    assert sorted(seen) == [f"c{i:03}" for i in range(75)]
    if order == "errors":
        assert [c["errors"] for c in first["items"][:38]] == [1] * 37 + [0]


def test_it_pages_the_rounds_of_a_long_conversation_like_the_timeline(member_client, project, records,
                                                                    monkeypatch):
    monkeypatch.setattr(selectors, "ROUNDS_PER_PAGE", 2)
    batch = []
    for index in range(5):
        batch += [records.round(index=index), records.tool_result(round_id=f"r{index}")]
    store(project, batch + [records.tool_result(tool="outside_any_round")])
    url = f"/api/v1/projects/{project.slug}/conversations/conv-1"
    first = member_client.get(url).json()
    assert (first["page"], first["has_next"], first["total_rounds"]) == (1, True, 5)
    assert [r["round_id"] for r in first["rounds"]] == ["r0", "r1"]
    assert sorted(t["round_id"] or "-" for t in first["tool_executions"]) == ["-", "r0", "r1"]
    last = member_client.get(url, {"page": 3}).json()
    assert ([r["round_id"] for r in last["rounds"]], last["has_next"]) == (["r4"], False)
    assert [t["round_id"] for t in last["tool_executions"]] == ["r4"]  # rows outside rounds: page 1 only
    assert member_client.get(url, {"page": 4}).status_code == 404
    for bad in ("0", "-1", "x", "100001"):
        assert member_client.get(url, {"page": bad}).status_code == 400


def test_it_shows_a_conversation_in_a_fixed_number_of_queries(member_client, project, records,
                                                             django_assert_max_num_queries):
    batch = []
    for index in range(30):
        round_id = f"r{index}"
        batch += [records.round(index=index), records.tool_result(round_id=round_id), records.skill(round_id=round_id)]
    store(project, batch)
    # session, user, project, conversation, round count, rounds, two per kind of row (in rounds, outside), spans
    with django_assert_max_num_queries(13):
        assert member_client.get(f"/api/v1/projects/{project.slug}/conversations/conv-1").status_code == 200


def test_it_answers_404_for_an_unknown_conversation(member_client, project):
    for external_id in ("nope", "x" * 300):
        assert member_client.get(f"/api/v1/projects/{project.slug}/conversations/{external_id}").status_code == 404
    # A NUL byte is refused at the door (PostgreSQL cannot even compare it): 400, not 404.
    assert member_client.get(f"/api/v1/projects/{project.slug}/conversations/%00").status_code == 400


def test_it_downloads_an_artifact_as_an_attachment(member_client, project):
    data = b"<script>alert(1)</script>"
    artifact_store(project=project, artifact_id="artifact_" + "c" * 16, stream=io.BytesIO(data),
                   sha256=hashlib.sha256(data).hexdigest(), content_type="text/html", max_bytes=1000)
    response = member_client.get(f"/api/v1/projects/{project.slug}/artifacts/artifact_{'c' * 16}/download")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == data
    assert response["Content-Type"] == "text/html"
    assert response["Content-Disposition"] == f'attachment; filename="artifact_{"c" * 16}.txt"'
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Security-Policy"] == "sandbox"


def test_it_never_sends_a_hostile_stored_content_type(member_client, project):
    data = b"\x00\x01"
    artifact_store(project=project, artifact_id="artifact_" + "d" * 16, stream=io.BytesIO(data),
                   sha256=hashlib.sha256(data).hexdigest(), content_type="text/html\r\nSet-Cookie: a=b",
                   max_bytes=1000)
    response = member_client.get(f"/api/v1/projects/{project.slug}/artifacts/artifact_{'d' * 16}/download")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"] == f'attachment; filename="artifact_{"d" * 16}.bin"'
    assert "Set-Cookie" not in response


def test_it_answers_404_when_the_artifact_file_is_gone(member_client, project):
    data = b"{}"
    outcome = artifact_store(project=project, artifact_id="artifact_" + "e" * 16, stream=io.BytesIO(data),
                             sha256=hashlib.sha256(data).hexdigest(), content_type="application/json",
                             max_bytes=1000)
    artifact = Artifact.objects.get(pk=outcome.artifact.pk)
    artifact.file.storage.delete(artifact.file.name)
    response = member_client.get(f"/api/v1/projects/{project.slug}/artifacts/artifact_{'e' * 16}/download")
    assert response.status_code == 404


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


@pytest.mark.parametrize("external_id", ["team/alpha/run-7", "a b%c", "x?y#z", "日本/会話"])
def test_it_reads_back_a_conversation_whose_id_has_slashes_or_reserved_characters(member_client, project, records,
                                                                               external_id):
    from urllib.parse import quote

    store(project, [records.round(conversation=external_id, user_message="hi")])
    url = f"/api/v1/projects/{project.slug}/conversations/{quote(external_id, safe='/')}"
    response = member_client.get(url)
    assert response.status_code == 200, response.content
    assert response.json()["conversation"]["external_id"] == external_id


def test_it_answers_404_for_an_unknown_id_with_slashes(member_client, project):
    assert member_client.get(f"/api/v1/projects/{project.slug}/conversations/no/such/thing").status_code == 404
