"""PUT /api/v1/artifacts/{artifact_id}: storing bytes, re-uploads, and bad input."""

from __future__ import annotations

import hashlib
import os

import pytest

from dashboard.observatory.models import Artifact, IngestTransport
from dashboard.tuning.models import RetentionPolicy

from .database_faults import broken_reports, broken_table, busy_database, faults, names_nothing_internal

pytestmark = pytest.mark.django_db
ARTIFACT_ID = "artifact_" + "ab" * 8
DATA = b"region,total\nnorth,10\nsouth,12\n"


def put(client, auth, data=DATA, *, artifact_id=ARTIFACT_ID, sha=None, content_type="text/csv", **headers):
    headers.setdefault("HTTP_X_CONTENT_SHA256", sha or hashlib.sha256(data).hexdigest())
    return client.generic("PUT", f"/api/v1/artifacts/{artifact_id}", data, content_type=content_type, **auth, **headers)


def files_in(location) -> list[str]:
    return [os.path.join(d, f) for d, _, names in os.walk(location) for f in names]


def test_it_stores_an_artifact_under_a_generated_name(client, auth, project, _test_settings):
    response = put(client, auth)
    assert response.status_code == 201
    assert response.json() == {"artifact_id": ARTIFACT_ID, "sha256": hashlib.sha256(DATA).hexdigest(),
                               "size": len(DATA), "content_type": "text/csv"}
    artifact = Artifact.objects.get(project=project)
    assert ARTIFACT_ID not in artifact.file.name
    with artifact.file.open("rb") as handle:
        assert handle.read() == DATA
    assert len(files_in(_test_settings)) == 1
    assert str(_test_settings) not in response.content.decode()


def test_it_answers_200_to_an_identical_reupload_and_409_to_other_content(client, auth, _test_settings):
    put(client, auth)
    assert put(client, auth).status_code == 200
    response = put(client, auth, b"other bytes")
    assert response.status_code == 409
    assert Artifact.objects.count() == 1 and len(files_in(_test_settings)) == 1


def test_it_refuses_a_hash_mismatch_and_keeps_nothing(client, auth, _test_settings):
    response = put(client, auth, sha="0" * 64)
    assert response.status_code == 400
    assert Artifact.objects.count() == 0 and files_in(_test_settings) == []


@pytest.mark.parametrize("sha", ["", "xyz", "a" * 63, "g" * 64])
def test_it_refuses_a_missing_or_malformed_hash(client, auth, sha):
    assert put(client, auth, sha=sha or " ").status_code == 400
    assert Artifact.objects.count() == 0


@pytest.mark.parametrize(
    "artifact_id",
    ["..%2F..%2Fetc%2Fpasswd", "../../etc/passwd", "artifact_../../x", "artifact_ABCDEFABCDEFABCD",
     "artifact_123", "artifact_" + "a" * 65, "artifact_abcdefabcdefabcd%00", "notes.txt"],
)
def test_it_refuses_ids_that_are_not_artifact_hex(client, auth, artifact_id, _test_settings):
    response = put(client, auth, artifact_id=artifact_id)
    assert response.status_code in (400, 404)
    assert Artifact.objects.count() == 0 and files_in(_test_settings) == []


def test_it_refuses_an_artifact_over_the_size_limit(client, auth, settings, _test_settings):
    settings.OBSERVATORY_MAX_ARTIFACT_BYTES = 10
    assert put(client, auth).status_code == 413
    assert Artifact.objects.count() == 0 and files_in(_test_settings) == []


@pytest.mark.parametrize("length, status", [("abc", 400), ("-1", 400), ("1e3", 400), ("", 411)])
def test_it_refuses_a_malformed_or_missing_content_length(client, auth, length, status, _test_settings):
    response = put(client, auth, CONTENT_LENGTH=length)
    assert response.status_code == status and "error" in response.json()
    assert Artifact.objects.count() == 0 and files_in(_test_settings) == []


def test_it_stops_reading_a_body_longer_than_the_limit_it_declared(auth, project, _test_settings):
    """A client that lies about Content-Length: the stream is cut at the limit and
    the partial file removed."""
    import io

    from dashboard.observatory.services import ArtifactTooLarge, artifact_store

    data = b"x" * 5000
    with pytest.raises(ArtifactTooLarge):
        artifact_store(project=project, artifact_id=ARTIFACT_ID, stream=io.BytesIO(data),
                       sha256=hashlib.sha256(data).hexdigest(), content_type="text/plain", max_bytes=100,
                       chunk_size=64)
    assert Artifact.objects.count() == 0 and files_in(_test_settings) == []


def test_it_hashes_a_gzipped_upload_after_inflating_it(client, auth, project):
    import gzip

    response = put(client, auth, gzip.compress(DATA), sha=hashlib.sha256(DATA).hexdigest(), HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 201 and response.json()["size"] == len(DATA)
    with Artifact.objects.get().file.open("rb") as handle:
        assert handle.read() == DATA


def test_it_refuses_gzip_bombs_corrupt_gzip_other_encodings_and_bad_content_types(client, auth, settings,
                                                                                    _test_settings):
    import gzip

    settings.OBSERVATORY_MAX_ARTIFACT_BYTES = 1000
    bomb = b"0" * 1_000_000
    assert put(client, auth, gzip.compress(bomb), sha=hashlib.sha256(bomb).hexdigest(),
               HTTP_CONTENT_ENCODING="gzip").status_code == 413
    assert put(client, auth, b"not gzip at all", HTTP_CONTENT_ENCODING="gzip").status_code == 400
    assert put(client, auth, gzip.compress(DATA)[:-8], sha=hashlib.sha256(DATA).hexdigest(),
               HTTP_CONTENT_ENCODING="gzip").status_code == 400
    assert put(client, auth, HTTP_CONTENT_ENCODING="br").status_code == 415
    assert put(client, auth, content_type="text/html\r\nX-Evil: 1").status_code == 400
    assert Artifact.objects.count() == 0 and files_in(_test_settings) == []


def test_it_refuses_missing_wrong_and_revoked_keys(client, project, db):
    from dashboard.accounts.services import apikey_create, apikey_revoke

    key, text = apikey_create(project=project)
    apikey_revoke(key=key)
    for auth in ({}, {"HTTP_AUTHORIZATION": "Bearer po_nope"}, {"HTTP_AUTHORIZATION": f"Bearer {text}"}):
        assert put(client, auth).status_code == 401
    assert Artifact.objects.count() == 0


def test_it_keeps_artifacts_of_two_projects_apart(client, auth, other_auth, project, other_project):
    put(client, auth)
    # the other project can store its own artifact under the same id, not overwrite ours
    assert put(client, other_auth, b"theirs").status_code == 201
    mine = Artifact.objects.get(project=project)
    with mine.file.open("rb") as handle:
        assert handle.read() == DATA


def test_it_links_an_artifact_to_the_tool_execution_that_names_it(client, auth, records, project,
                                                                   django_capture_on_commit_callbacks):
    from dashboard.observatory.models import ToolExecution

    import json

    record = records.tool_result(result={"artifact_id": ARTIFACT_ID, "data_size_bytes": len(DATA)})
    with django_capture_on_commit_callbacks(execute=True):
        client.generic("POST", "/api/v1/records", json.dumps({"records": [record]}), content_type="application/json", **auth)
        put(client, auth)
    artifact = Artifact.objects.get()
    assert artifact.tool_execution == ToolExecution.objects.get()
    assert artifact.conversation.external_id == "conv-1"


# --- a busy database and a broken one, for real ------------------------------------

@pytest.mark.django_db(transaction=True)
def test_it_answers_503_with_retry_after_when_the_database_is_really_busy(client, auth, project, monkeypatch,
                                                                             _test_settings):
    with busy_database(monkeypatch, "observatory_artifact"):
        response = put(client, auth)
    assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert Artifact.objects.count() == 0 and files_in(_test_settings) == []


@pytest.mark.django_db(transaction=True)
def test_it_answers_500_naming_nothing_when_the_database_is_broken_and_keeps_no_file(
        client, auth, project, caplog, _test_settings):
    """The retention table gone, read after the bytes were written to storage: the
    file is removed, nothing is kept, the answer names no table and no path."""
    with broken_table(RetentionPolicy._meta.db_table):
        response = put(client, auth)
    assert response.status_code == 500 and "Retry-After" not in response
    assert names_nothing_internal(response.content.decode()) and str(_test_settings) not in response.content.decode()
    assert Artifact.objects.count() == 0 and files_in(_test_settings) == []
    (report,) = broken_reports(caplog)
    assert f"project {project.pk}" in report.getMessage() and f"{len(DATA)} bytes" in report.getMessage()
    assert faults(IngestTransport.ARTIFACTS, project) == 1
