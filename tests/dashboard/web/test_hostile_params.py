"""Every page and read endpoint, fed junk query parameters, answers below 500."""

from __future__ import annotations

import pytest
from tests.dashboard.web.pages_factories import add_artifact, add_span, full_conversation

from dashboard.observatory.models import CompressionEvent, Conversation, Round, ToolExecution

pytestmark = pytest.mark.django_db

JUNK = [
    "", "-1", "0", "999999999999999999999999", "1e309", "nan", "' OR 1=1 --", "<script>alert(1)</script>",
    "x" * 5000, "２０２６-１１-２１", "2026-13-45", "2026-11-21T25:61", "../../etc/passwd", "\u202e\ufeff",
    "%", "[]", "{}", "true", "null",
]
PARAMS = ["q", "page", "cursor", "after", "before", "sort", "order", "status", "model", "user", "tool",
          "has_errors", "since", "until", "range", "level", "rounds", "limit", "direction", "a", "b", "c",
          "score", "score_min", "score_max", "score_label", "negative", "scored_since", "scored_until"]


@pytest.fixture
def urls(project):
    full_conversation(project)
    conversation = Conversation.objects.get(project=project)
    execution = ToolExecution.objects.filter(project=project).first()
    round_ = Round.objects.filter(conversation=conversation).first()
    compression = CompressionEvent.objects.filter(project=project).first()
    artifact = add_artifact(project, b'{"a": 1}')
    add_span(project, "ab" * 16, "cd" * 8, "agent.round")
    from dashboard.judging.services import dataset_create, review_queue_create

    queue = review_queue_create(project=project, name="q", query="", user=None,
                                conversations=Conversation.objects.filter(project=project))
    item = queue.items.first()
    dataset = dataset_create(project=project, name="d", user=None)
    p = f"/p/{project.slug}/"
    return [
        p, p + "conversations/", p + "conversations/rows/", p + f"conversations/{conversation.pk}/",
        p + f"conversations/{conversation.pk}/export.json", p + f"tool-executions/{execution.pk}/observation/",
        p + f"tool-executions/{execution.pk}/levels/", p + f"rounds/{round_.pk}/waterfall/", p + "tools/",
        p + f"tools/{execution.tool_name}/", p + f"compressions/{compression.pk}/", p + "artifacts/",
        p + f"artifacts/{artifact.artifact_id}/", p + f"traces/{'ab' * 16}/", p + "keys/",
        p + "compare/", p + f"compare/?a={conversation.pk}&b={conversation.pk}", p + "views/",
        p + "traces/", p + "scores/", p + "review/", p + f"review/{queue.pk}/", p + f"review/{queue.pk}/items/{item.pk}/",
        p + "datasets/", p + f"datasets/{dataset.pk}/", p + f"datasets/{dataset.pk}/export.jsonl",
        p + "conversations/export.csv", p + "tools/export.csv", p + f"conversations/{conversation.pk}/tool-calls.csv",
        f"/api/v1/projects/{project.slug}/conversations",
        f"/api/v1/projects/{project.slug}/conversations/{conversation.external_id}",
        f"/api/v1/projects/{project.slug}/tools",
    ]


def test_it_never_answers_500_to_junk_parameters(client_in, urls):
    failures = []
    for url in urls:
        for value in JUNK:
            query = {name: value for name in PARAMS}
            response = client_in.get(url, query)
            if response.status_code >= 500:
                failures.append((url, value[:20], response.status_code))
    assert failures == []
