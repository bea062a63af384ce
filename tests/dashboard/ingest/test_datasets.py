"""GET and POST /api/v1/datasets/{name}/items: JSON Lines out and in with a project
key; a POST all or nothing, bounded before parsing; the pipeline's fetch_dataset and
send_dataset against a live server; another project's dataset a 404."""

from __future__ import annotations

import json

import pytest

from dashboard.judging.models import Dataset, DatasetItem
from dashboard.judging.services import dataset_create
from pipeline import DatasetItem as Item
from pipeline import fetch_dataset, send_dataset

pytestmark = pytest.mark.django_db


def url(name: str) -> str:
    return f"/api/v1/datasets/{name}/items"


def jsonl(*items: dict) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def post(client, auth, name, body, content_type="application/x-ndjson"):
    return client.post(url(name), data=body, content_type=content_type, **auth)


def test_a_post_makes_the_dataset_and_a_second_post_adds_only_what_is_new(client, auth, project):
    first = post(client, auth, "smoke", jsonl({"item_id": "a", "input": {"q": "1"}},
                                              {"item_id": "b", "input": {"q": "2"}, "expected_output": "two"}))
    assert first.status_code == 200 and first.json() == {"added": 2, "duplicates": 0}
    again = post(client, auth, "smoke", jsonl({"item_id": "b", "input": {"q": "2"}}, {"item_id": "c", "input": {}}))
    assert again.json() == {"added": 1, "duplicates": 1}
    dataset = Dataset.objects.get(project=project, name="smoke")
    assert list(DatasetItem.objects.filter(dataset=dataset).order_by("id").values_list("item_id", "expected_output")) \
        == [("a", None), ("b", "two"), ("c", None)]


def test_a_get_streams_the_items_in_order(client, auth, project):
    dataset = dataset_create(project=project, name="smoke", user=None)
    DatasetItem.objects.create(dataset=dataset, item_id="x", input={"q": "<script>"}, expected_output=[1, 2])
    response = client.get(url("smoke"), **auth)
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert [json.loads(line) for line in lines] == [{"item_id": "x", "input": {"q": "<script>"}, "output": None,
                                                    "expected_output": [1, 2], "source": {}, "metadata": {}}]


@pytest.mark.parametrize("body, status, words", [
    (b'{"input": {}}\n{"input": 3}\n', 400, "line 2: input"),
    (b'{"input": {}}\n{oops\n', 400, "line 2: not JSON"),
    (b"\n", 400, "no items"),
    (b'{"input": {}}\n' * 10_002, 413, "too many items"),
    (b"\xff\n", 400, "line 1"),
])
def test_a_bad_post_stores_nothing(client, auth, body, status, words):
    response = post(client, auth, "smoke", body)
    assert response.status_code == status and words in response.json()["error"]
    assert not DatasetItem.objects.exists() and not Dataset.objects.exists()


def test_it_refuses_other_content_types_bad_names_and_keys(client, auth):
    assert post(client, auth, "smoke", b'{"input": {}}', content_type="text/plain").status_code == 415
    assert post(client, auth, "a" * 101, jsonl({"input": {}})).status_code == 400
    assert post(client, {}, "smoke", jsonl({"input": {}})).status_code == 401
    assert client.get(url("nothing"), **auth).status_code == 404
    assert not Dataset.objects.exists()


def test_another_projects_dataset_is_a_404(client, auth, other_project):
    dataset_create(project=other_project, name="theirs", user=None)
    assert client.get(url("theirs"), **auth).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_pipeline_sends_and_fetches_a_dataset(live_server, api_key, project):
    items = [Item(item_id=f"case-{i}", input={"user_message": f"question {i}"}, expected_output=f"answer {i}")
             for i in range(3)]
    assert send_dataset(live_server.url, api_key, "regression run", items) == {"added": 3, "duplicates": 0}
    assert send_dataset(live_server.url, api_key, "regression run", items) == {"added": 0, "duplicates": 3}
    fetched = list(fetch_dataset(live_server.url, api_key, "regression run"))
    assert fetched == items
    with pytest.raises(Exception, match="404"):
        list(fetch_dataset(live_server.url, api_key, "no such dataset"))
