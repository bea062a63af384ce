"""Dataset pages: a round or a conversation added from the timeline, or every row of a
filtered list, keeping the input the model had (user message, context, tools), the
output as recorded and an editable expected output; items listed with their source
links; JSON Lines export (streamed) and import (all or nothing); another project's
dataset, a stranger and a viewer see or change nothing."""

from __future__ import annotations

import io
import json

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import PASSWORD, add_span, full_conversation, message_record, store

from dashboard.accounts.models import Membership
from dashboard.accounts.services import membership_add
from dashboard.judging.models import Dataset, DatasetItem
from dashboard.judging.services import dataset_create
from dashboard.observatory.models import Conversation, Round
from pipeline import parse_dataset_line

pytestmark = pytest.mark.django_db
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture
def conversation(project):
    full_conversation(project, "conv-1", rounds=2)
    store(project, [
        message_record("conv-1", 1, "assistant", "Sales were 12.", round_id="conv-1-r0"),
        message_record("conv-1", 2, "user", "And in the south?", round_id="conv-1-r1"),
    ])
    Conversation.objects.filter(external_id="conv-1").update(title=HOSTILE)
    return Conversation.objects.get(project=project, external_id="conv-1")


def add(client, project, **fields):
    return client.post(reverse("web:dataset_add", args=[project.slug]), fields)


def test_a_round_added_from_the_timeline_keeps_its_input_output_and_source(client_in, project, conversation):
    assert 'data-testid="add-to-dataset-round"' in client_in.get(
        reverse("web:conversation", args=[project.slug, conversation.pk])).content.decode()
    round1 = Round.objects.get(conversation=conversation, round_id="conv-1-r1")
    response = add(client_in, project, target="round", object=round1.pk, new_name="regressions")
    dataset = Dataset.objects.get(project=project, name="regressions")
    assert response.status_code == 302 and response["Location"].endswith(f"/datasets/{dataset.pk}/")
    item = DatasetItem.objects.get(dataset=dataset)
    assert item.item_id == "round:conv-1:conv-1-r1" and item.source_round == round1
    assert item.input["user_message"] == round1.user_message
    # the context the model saw: the messages of the rounds before (not this round's)
    assert [m["content"] for m in item.input["messages"]] == ["What were sales in the north?", "Sales were 12."]
    assert item.input["tools_called"] == ["load_csv", "query_sales"]  # no span says what was offered
    assert "tools_offered" not in item.input
    assert item.output["final_answer"] == round1.final_answer
    assert [call["tool"] for call in item.output["tool_calls"]] == ["query_sales", "load_csv"]
    assert item.source == {"conversation_id": "conv-1", "round_id": "conv-1-r1", "trace_id": "", "model": "gpt-4o"}
    again = add(client_in, project, target="round", object=round1.pk, dataset=dataset.pk)
    assert again.status_code == 302 and DatasetItem.objects.filter(dataset=dataset).count() == 1


SALES = {"type": "object", "properties": {"region": {"type": "string"}}}


def test_the_tools_offered_to_the_model_are_kept_where_a_span_says_else_the_tools_called(client_in, project,
                                                                                         conversation):
    import json as json_

    round0 = Round.objects.get(conversation=conversation, round_id="conv-1-r0")  # a recorded round, in a trace
    round1 = Round.objects.get(conversation=conversation, round_id="conv-1-r1")
    # round 0: an OpenInference LLM span of its trace, in the round's time, lists the tools
    add_span(project, "ab" * 16, "1" * 16, "llm", start_ms=500, attributes={
        "llm.tools.0.tool.json_schema": json_.dumps({"type": "function", "function": {
            "name": "query_sales", "description": HOSTILE, "parameters": SALES}}),
        "llm.tools.1.tool.json_schema": json_.dumps({"name": "send_email"})})
    add_span(project, "ab" * 16, "3" * 16, "later llm", start_ms=3_600_000, attributes={
        "gen_ai.tool.definitions": json_.dumps([{"type": "function", "name": "not_this_round"}])})
    # round 1: its own model call span (GenAI) says
    add_span(project, "ef" * 16, "2" * 16, "chat", attributes={
        "gen_ai.tool.definitions": json_.dumps([{"type": "function", "name": "load_csv"},
                                                {"type": "function", "name": "plot"}])})
    Round.objects.filter(pk=round1.pk).update(trace_id="ef" * 16, span_id="2" * 16)

    add(client_in, project, target="round", object=round0.pk, new_name="offered")
    add(client_in, project, target="round", object=round1.pk, new_name="offered")
    add(client_in, project, target="conversation", object=conversation.pk, new_name="offered")
    items = {item.item_id: item.input for item in DatasetItem.objects.filter(dataset__name="offered")}
    assert items["round:conv-1:conv-1-r0"]["tools_offered"] == [
        {"name": "query_sales", "description": HOSTILE, "parameters": SALES}, {"name": "send_email"}]
    assert [t["name"] for t in items["round:conv-1:conv-1-r1"]["tools_offered"]] == ["load_csv", "plot"]
    assert [t["name"] for t in items["conversation:conv-1"]["tools_offered"]] == [
        "query_sales", "send_email", "load_csv", "plot"]
    assert not any("tools_called" in item for item in items.values())
    page = client_in.get(reverse("web:dataset", args=[project.slug, Dataset.objects.get(name="offered").pk]))
    assert HOSTILE not in page.content.decode()


def test_a_conversation_and_a_filtered_list_are_added_whole(client_in, project, conversation):
    full_conversation(project, "conv-2", rounds=1)
    Conversation.objects.filter(external_id="conv-2").update(model="claude")
    add(client_in, project, target="conversation", object=conversation.pk, new_name="whole")
    item = DatasetItem.objects.get(dataset__name="whole")
    assert item.item_id == "conversation:conv-1" and len(item.output["final_answers"]) == 2
    add(client_in, project, target="list", query="model=claude", new_name="failing")
    assert list(DatasetItem.objects.filter(dataset__name="failing").values_list("item_id", flat=True)) == [
        "conversation:conv-2"]


@pytest.mark.parametrize("fields", [
    {"target": "round"}, {"target": "round", "object": "1"}, {"target": "star", "object": "1", "new_name": "x"},
    {"target": "round", "object": "1", "new_name": "a/b"}, {"target": "list", "query": "score_min=x", "new_name": "x"},
])
def test_a_bad_add_form_adds_nothing(client_in, project, conversation, fields):
    response = add(client_in, project, **fields)
    assert response.status_code in (302, 404) and not DatasetItem.objects.exists()


def test_the_dataset_page_lists_items_with_links_and_edits_the_expected_output(client_in, project, conversation):
    round0 = Round.objects.get(conversation=conversation, round_id="conv-1-r0")
    hostile_name = "<img src=x onerror=alert(1)>"
    add(client_in, project, target="round", object=round0.pk, new_name=hostile_name)
    dataset = Dataset.objects.get()
    item = DatasetItem.objects.get()
    page = client_in.get(reverse("web:dataset", args=[project.slug, dataset.pk])).content.decode()
    assert hostile_name not in page and "&lt;img src=x" in page
    assert f"/conversations/{conversation.pk}/#round-0" in page
    url = reverse("web:dataset_item", args=[project.slug, dataset.pk, item.pk])
    client_in.post(url, {"expected": '{"answer": "Sales were 12.", "figures": [12]}'})
    item.refresh_from_db()
    assert item.expected_output == {"answer": "Sales were 12.", "figures": [12]}
    client_in.post(url, {"expected": "Sales were <b>12</b>."})
    item.refresh_from_db()
    assert item.expected_output == "Sales were <b>12</b>."
    assert "Sales were &lt;b&gt;12&lt;/b&gt;." in client_in.get(reverse("web:dataset", args=[project.slug, dataset.pk])).content.decode()
    client_in.post(reverse("web:dataset_item_delete", args=[project.slug, dataset.pk, item.pk]))
    assert not DatasetItem.objects.exists()


def test_export_streams_json_lines_the_pipeline_reads_and_import_takes_them_back(client_in, project, conversation):
    add(client_in, project, target="conversation", object=conversation.pk, new_name="source")
    for round_ in Round.objects.filter(conversation=conversation):
        add(client_in, project, target="round", object=round_.pk, new_name="source")
    source = Dataset.objects.get(name="source")
    DatasetItem.objects.filter(dataset=source).update(expected_output={"answer": "12"})
    response = client_in.get(reverse("web:dataset_export", args=[project.slug, source.pk]))
    assert response.streaming and response["Content-Type"].startswith("application/x-ndjson")
    text = b"".join(response.streaming_content).decode()
    items = [parse_dataset_line(line) for line in text.splitlines()]
    assert [item.item_id for item in items] == list(DatasetItem.objects.filter(dataset=source).order_by("id")
                                                   .values_list("item_id", flat=True))
    assert all(item.expected_output == {"answer": "12"} for item in items)

    copy = dataset_create(project=project, name="copy", user=None)
    url = reverse("web:dataset_import", args=[project.slug, copy.pk])
    client_in.post(url, {"file": io.BytesIO(text.encode())})
    client_in.post(url, {"file": io.BytesIO(text.encode())})  # twice: nothing more
    assert DatasetItem.objects.filter(dataset=copy).count() == len(items)
    copied = DatasetItem.objects.get(dataset=copy, item_id="conversation:conv-1")
    assert copied.input == DatasetItem.objects.get(dataset=source, item_id="conversation:conv-1").input
    assert copied.source_conversation is None  # an import names its source as text only


@pytest.mark.parametrize("lines, words", [
    ('{"input": {}}\n{"input": "not an object"}\n', "line 2: input"),
    ('{"input": {}}\nnot json\n', "line 2: not JSON"),
    ('{"input": {}, "extra": 1}\n', "line 1: extra"),
    ('\n\n', "no items"),
    ('{"input": {"a": ' * 40 + "1" + "}" * 40 + "}\n", "line 1"),
])
def test_a_bad_import_imports_nothing_and_says_which_line(client_in, project, lines, words):
    dataset = dataset_create(project=project, name="d", user=None)
    response = client_in.post(reverse("web:dataset_import", args=[project.slug, dataset.pk]),
                              {"file": io.BytesIO(lines.encode())}, follow=True)
    assert words in response.content.decode()
    assert not DatasetItem.objects.exists()


def test_strangers_viewers_and_other_projects_see_nothing(client, client_in, project, other_project, stranger,
                                                          django_user_model, conversation):
    mine = dataset_create(project=project, name="mine", user=None)
    theirs = dataset_create(project=other_project, name="theirs", user=None)
    full_conversation(other_project, "their-conv", rounds=1)
    their_round = Round.objects.get(project=other_project)
    assert client_in.get(reverse("web:dataset", args=[project.slug, theirs.pk])).status_code == 404
    assert client_in.get(reverse("web:dataset_export", args=[project.slug, theirs.pk])).status_code == 404
    assert add(client_in, project, target="round", object=their_round.pk, dataset=mine.pk).status_code == 404
    assert add(client_in, project, target="round", object=conversation.pk, dataset=theirs.pk).status_code == 404
    client.force_login(stranger)
    for url in (reverse("web:datasets", args=[project.slug]), reverse("web:dataset", args=[project.slug, mine.pk]),
                reverse("web:dataset_export", args=[project.slug, mine.pk])):
        assert client.get(url).status_code == 404
    viewer = django_user_model.objects.create_user("vi", password=PASSWORD)
    membership_add(project=project, user=viewer, role=Membership.Role.VIEWER)
    client.force_login(viewer)
    assert client.get(reverse("web:dataset", args=[project.slug, mine.pk])).status_code == 200
    assert add(client, project, target="conversation", object=conversation.pk, dataset=mine.pk).status_code == 404
    assert client.post(reverse("web:datasets", args=[project.slug]), {"name": "v"}).status_code == 404
    assert not DatasetItem.objects.exists() and not Dataset.objects.filter(name="v").exists()


def test_the_dataset_page_pages_its_items(client_in, project, monkeypatch):
    from dashboard.web.views import datasets as views

    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    dataset = dataset_create(project=project, name="d", user=None)
    DatasetItem.objects.bulk_create([DatasetItem(dataset=dataset, item_id=f"i{i}", input={"n": i}) for i in range(5)])
    url = reverse("web:dataset", args=[project.slug, dataset.pk])
    first = client_in.get(url)
    assert [item.item_id for item in first.context["items"]] == ["i0", "i1"]
    second = client_in.get(url, {"after": first.context["next_after"]})
    assert [item.item_id for item in second.context["items"]] == ["i2", "i3"]
    assert json.loads(json.dumps(second.context["total"])) == 5
