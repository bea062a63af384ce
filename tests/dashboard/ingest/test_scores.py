"""POST and GET /api/v1/scores: a batch stored with per-score refusals, retries and
edits, configs enforced, every kind of junk a short 4xx with nothing half-stored,
10,000 scores refused before the body is parsed, and a key seeing only its project."""

from __future__ import annotations

import gzip
import json

import pytest

from dashboard.accounts.services import apikey_create, apikey_revoke
from dashboard.judging.models import Score, ScoreConfig
from tests.dashboard.web.pages_factories import full_conversation

pytestmark = pytest.mark.django_db
URL = "/api/v1/scores"


def post(client, auth, body, content_type="application/json", **extra):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(URL, data=data, content_type=content_type, **auth, **extra)


def item(**fields):
    return {"name": "helpfulness", "value": 4, "conversation_id": "conv-1", **fields}


def test_it_stores_a_batch_and_links_what_is_stored(client, auth, project, api_key):
    full_conversation(project, "conv-1")
    response = post(client, auth, {"scores": [
        item(score_id="a"), item(score_id="b", round_id="conv-1-r0", value=True, name="thumbs"),
        item(score_id="c", value="correct", name="verdict", comment="quotes the figure"),
    ]})
    assert response.status_code == 200, response.content
    assert response.json() == {"accepted": 3, "duplicates": 0, "updated": 0, "rejected": []}
    rows = {s.score_id: s for s in Score.objects.filter(project=project)}
    assert rows["a"].conversation.external_id == "conv-1" and rows["b"].round.round_id == "conv-1-r0"
    assert (rows["b"].kind, rows["c"].kind, rows["c"].label) == ("boolean", "categorical", "correct")
    assert {s.source for s in rows.values()} == {"api"}
    assert rows["a"].author_key.project == project and rows["a"].author_name.startswith("key test")


def test_it_lists_each_refused_score_by_index_and_stores_the_others(client, auth, project):
    ScoreConfig.objects.create(project=project, name="helpfulness", kind="numeric", min_value=1, max_value=5)
    response = post(client, auth, {"scores": [
        item(score_id="ok"),
        item(value=9),
        "not a score",
        item(span_id="1" * 16),
        item(conversation_id=None),
        item(value=None),
        item(value={"nested": 1}),
        item(trace_id="XYZ"),
        item(surprise=1),
        item(value=2**60),
        item(score_id="\x01bad"),
        item(score_id="ok2"),
    ]})
    assert response.status_code == 200
    answer = response.json()
    assert answer["accepted"] == 2
    errors = {r["index"]: r["error"] for r in answer["rejected"]}
    assert sorted(errors) == list(range(1, 11))
    assert errors[1] == "helpfulness must be within 1..5; got 9"
    assert errors[2] == "a score must be a JSON object"
    assert errors[3] == "span_id needs trace_id"
    assert errors[4].startswith("name what is scored")
    assert errors[5] == "a score needs a value or a label"
    assert errors[7].startswith("trace_id: String should match pattern")
    assert errors[8] == "surprise: Extra inputs are not permitted"
    assert all(len(error) <= 300 for error in errors.values())
    assert set(Score.objects.values_list("score_id", flat=True)) == {"ok", "ok2"}


def test_a_retry_is_a_duplicate_and_a_change_an_edit(client, auth, project):
    batch = {"scores": [item(score_id="s-1"), item(score_id="s-2")]}
    assert post(client, auth, batch).json()["accepted"] == 2
    assert post(client, auth, batch).json() == {"accepted": 0, "duplicates": 2, "updated": 0, "rejected": []}
    changed = post(client, auth, {"scores": [item(score_id="s-1", value=1, comment="worse on reread")]}).json()
    assert changed["updated"] == 1
    edit = Score.objects.get(score_id="s-1").edits.get()
    assert edit.changes == {"value": [4.0, 1.0], "comment": ["", "worse on reread"]} and edit.source == "api"


def test_it_takes_gzip(client, auth, project):
    body = gzip.compress(json.dumps({"scores": [item()]}).encode())
    response = post(client, auth, body, HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 200 and Score.objects.count() == 1


def test_it_refuses_ten_thousand_scores_before_parsing_the_body(client, auth, monkeypatch):
    from dashboard.ingest import scores

    def parse(*args, **kwargs):
        raise AssertionError("the body was parsed")

    monkeypatch.setattr(scores, "load_json", parse)
    body = json.dumps({"scores": [item(score_id=f"s-{i}", comment='tricky "{" } text') for i in range(10_000)]})
    response = post(client, auth, body)
    assert response.status_code == 413
    assert response.json() == {"error": "too many scores in one batch (at most 1000)"}
    assert not Score.objects.exists()


def test_it_counts_braces_inside_strings_as_text(client, auth, settings):
    settings.OBSERVATORY_MAX_SCORES_PER_BATCH = 2
    tricky = item(comment='{{{ \\" {{ \\\\" {', label="{")
    response = post(client, auth, {"scores": [dict(tricky, score_id="a"), dict(tricky, score_id="b")]})
    assert response.status_code == 200 and response.json()["accepted"] == 2
    assert post(client, auth, {"scores": [item(score_id=str(i)) for i in range(3)]}).status_code == 413


def test_it_refuses_a_long_list_that_holds_no_objects(client, auth):
    assert post(client, auth, {"scores": list(range(2000))}).status_code == 413


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "invalid JSON"),
    (b"[]", 400, "body must be a JSON object"),
    (b'{"scores": {}}', 400, 'body needs a "scores" list'),
    (b'{"scores": [NaN]}', 400, "NaN is not a JSON value"),
    (b"\xff\xfe", 400, "body is not valid UTF-8"),
    (b'{"scores": [' + b"[" * 40 + b"]" * 40 + b"]}", 400, "JSON nested deeper"),
    (b'{"scores": [{"name": {"a": {"b": {"c": {"d": {"e": {"f": {"g": 1}}}}}}}}]}', 400, "JSON nested deeper"),
])
def test_it_answers_junk_with_a_short_400(client, auth, body, status, message):
    response = post(client, auth, body)
    assert response.status_code == status
    assert message in response.json()["error"]
    assert not Score.objects.exists()


def test_it_refuses_other_content_types_and_oversized_bodies(client, auth, settings):
    assert post(client, auth, "name=x", content_type="application/x-www-form-urlencoded").status_code == 415
    settings.OBSERVATORY_MAX_BODY_BYTES = 1024
    response = post(client, auth, {"scores": [item(comment="x" * 2000)]})
    assert response.status_code == 413 and not Score.objects.exists()


def test_it_refuses_missing_wrong_and_revoked_keys(client, project):
    body = {"scores": [item()]}
    assert post(client, {}, body).status_code == 401
    assert post(client, {"HTTP_AUTHORIZATION": "Bearer po_nope_nope"}, body).status_code == 401
    key, text = apikey_create(project=project)
    apikey_revoke(key=key)
    assert post(client, {"HTTP_AUTHORIZATION": f"Bearer {text}"}, body).status_code == 401
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {text}").status_code == 401
    assert not Score.objects.exists()


def test_it_keeps_hostile_text_as_text(client, auth):
    hostile = "<script>alert(1)</script>\u202e\ud800"
    response = post(client, auth, json.dumps({"scores": [item(comment=hostile)]}, ensure_ascii=True))
    assert response.status_code == 200
    assert Score.objects.get().comment == "<script>alert(1)</script>\u202e\ufffd"


# --- GET ------------------------------------------------------------------------------


def get(client, auth, **params):
    return client.get(URL, params, **auth)


def test_it_lists_the_keys_project_scores_newest_first_and_filtered(client, auth, project, other_api_key):
    full_conversation(project, "conv-1")
    post(client, auth, {"scores": [
        item(score_id="a", value=1), item(score_id="b", value=5), item(score_id="c", name="thumbs", value=False),
        item(score_id="d", conversation_id="elsewhere", name="thumbs", value=True),
    ]})
    post(client, {"HTTP_AUTHORIZATION": f"Bearer {other_api_key}"}, {"scores": [item(score_id="theirs")]})

    def ids(**params):
        response = get(client, auth, **params)
        assert response.status_code == 200, response.content
        return [s["score_id"] for s in response.json()["scores"]]

    assert ids() == ["d", "c", "b", "a"]
    assert ids(name="thumbs") == ["d", "c"]
    assert ids(negative="true") == ["c"]
    assert ids(negative="false") == ["d", "b", "a"]
    assert ids(min_value=2, name="helpfulness") == ["b"]
    assert ids(conversation_id="conv-1") == ["c", "b", "a"]
    assert ids(linked="false") == ["d"]
    assert ids(source="ui") == []
    first = get(client, auth, limit=3).json()
    assert [s["score_id"] for s in first["scores"]] == ["d", "c", "b"]
    assert ids(before=first["next"]) == ["a"]
    shown = get(client, auth, name="helpfulness", max_value=1).json()["scores"][0]
    assert shown | {"occurred_at": None, "updated_at": None} == {
        "score_id": "a", "name": "helpfulness", "kind": "numeric", "value": 1.0, "label": "", "comment": "",
        "negative": False, "source": "api", "author": shown["author"], "occurred_at": None, "updated_at": None,
        "target": "conversation", "conversation_id": "conv-1", "round_id": "", "tool_call_id": "", "trace_id": "",
        "span_id": "", "response_id": "", "linked": True, "edits": 0,
    }


def test_another_projects_key_sees_none_of_them(client, auth, other_api_key):
    post(client, auth, {"scores": [item()]})
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {other_api_key}")
    assert response.status_code == 200 and response.json() == {"scores": [], "next": None}


@pytest.mark.parametrize("params", [
    {"trace_id": "nothex"}, {"limit": 0}, {"limit": 501}, {"min_value": "nan"}, {"since": "yesterday"},
    {"source": "email"}, {"negative": "maybe"}, {"before": -1}, {"name": "x" * 201},
])
def test_it_answers_bad_filters_with_a_400(client, auth, params):
    response = get(client, auth, **params)
    assert response.status_code == 400 and "error" in response.json()


def test_it_reads_a_page_in_a_constant_number_of_queries(client, auth, django_assert_max_num_queries):
    post(client, auth, {"scores": [item(score_id=str(i)) for i in range(50)]})
    with django_assert_max_num_queries(3):  # the key's check, the conversation filter's lookup, the page
        assert len(get(client, auth, conversation_id="conv-1").json()["scores"]) == 50


def test_it_publishes_the_pipeline_score_schema_in_openapi(client):
    schema = client.get("/api/openapi.json").json()
    body = schema["paths"]["/api/v1/scores"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["scores"]["items"] == {"$ref": "#/components/schemas/ScoreRecord"}
    assert body["properties"]["scores"]["maxItems"] == 1000
    published = schema["components"]["schemas"]["ScoreRecord"]
    assert {"name", "value", "label", "score_id", "trace_id", "span_id"} <= published["properties"].keys()
    assert "get" in schema["paths"]["/api/v1/scores"]
