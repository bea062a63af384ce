"""Every list a page or the read API shows is scoped to the project in its URL.

The user belongs to both projects, so a list that forgot its project filter would show
the other project's rows (a 404 test on a stranger's project cannot catch that). The
other project holds rows with markers that must never appear, and numbers that would
change every total. A new list page or API list gets a row in LISTS.
"""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from dashboard.accounts.services import membership_add
from tests.dashboard.web.pages_factories import add_artifact, add_span, full_conversation, store, tool_record

pytestmark = pytest.mark.django_db

MARKER = "leak-marker"

# (name, how to build the URL from the project slug): every list a member can open.
LISTS = [
    ("overview", lambda slug: reverse("web:overview", args=[slug])),
    ("conversations", lambda slug: reverse("web:conversations", args=[slug])),
    ("conversation rows", lambda slug: reverse("web:conversation_rows", args=[slug])),
    ("conversations searched", lambda slug: reverse("web:conversations", args=[slug]) + "?q=north"),
    ("tools", lambda slug: reverse("web:tools", args=[slug])),
    ("tool detail", lambda slug: reverse("web:tool", args=[slug, "query_sales"])),
    ("artifacts", lambda slug: reverse("web:artifacts", args=[slug])),
    ("traces", lambda slug: reverse("web:traces", args=[slug])),
    ("traces searched", lambda slug: reverse("web:traces", args=[slug]) + "?q=e&has_errors=on"),
    ("logs", lambda slug: reverse("web:logs", args=[slug])),
    ("saved views", lambda slug: reverse("web:saved_views", args=[slug])),
    ("conversations csv", lambda slug: reverse("web:conversations_export", args=[slug])),
    ("tools csv", lambda slug: reverse("web:tools_export", args=[slug])),
    ("keys", lambda slug: reverse("web:keys", args=[slug])),
    ("api conversations", lambda slug: f"/api/v1/projects/{slug}/conversations"),
    ("api conversations searched", lambda slug: f"/api/v1/projects/{slug}/conversations?q=north"),
    ("api tools", lambda slug: f"/api/v1/projects/{slug}/tools"),
    ("scores", lambda slug: reverse("web:scores", args=[slug])),
    ("conversations by score", lambda slug: reverse("web:conversations", args=[slug]) + "?negative=on"),
    ("traces by score", lambda slug: reverse("web:traces", args=[slug]) + "?negative=on"),
    ("review queues", lambda slug: reverse("web:review_queues", args=[slug])),
    ("datasets", lambda slug: reverse("web:datasets", args=[slug])),
]


@pytest.fixture
def two_projects(member, project, other_project):
    """``project`` (ours) and ``other_project`` (theirs), the member in both; theirs
    holds many more rows, each carrying the marker where a text can."""
    membership_add(project=other_project, user=member)
    full_conversation(project, "ours-1")
    for n in range(3):
        full_conversation(other_project, f"{MARKER}-conversation-{n}")
    store(other_project, [tool_record(f"{MARKER}-conversation-0", tool=f"{MARKER}_tool", success=False,
                                      error_type=f"{MARKER}_error", observation=f"{MARKER} observation")])
    artifact = add_artifact(other_project, f'{{"{MARKER}": 1}}'.encode())
    add_span(project, "a" * 32, "1" * 16, "our-root", status_code=2)
    add_span(other_project, "b" * 32, "1" * 16, f"{MARKER}-root-span", status_code=2, service_name=MARKER)
    from dashboard.accounts.services import apikey_create
    from dashboard.observatory.models import LogRecord
    from dashboard.web.models import SavedView

    apikey_create(project=other_project, name=f"{MARKER}-key")
    LogRecord.objects.create(project=other_project, trace_id="b" * 32, span_id="1" * 16, record_hash="0" * 32,
                             event_name=f"{MARKER}.event", body=f"{MARKER} log body", service_name=MARKER)
    SavedView.objects.create(project=other_project, owner=member, name=f"{MARKER}-view", query="q=x", shared=True)
    from dashboard.judging.services import Author, dataset_create, review_queue_create, scores_store
    from pipeline import ScoreRecord

    for owner, conversation, trace in ((project, "ours-1", "a" * 32), (other_project, f"{MARKER}-conversation-0",
                                                                        "b" * 32)):
        name = "our-score" if owner == project else f"{MARKER}-score"
        scores_store(project=owner, author=Author.of_key(None), scores=[
            ScoreRecord(name=name, value=False, conversation_id=conversation),
            ScoreRecord(name=name, value=False, trace_id=trace)])
    review_queue_create(project=other_project, name=f"{MARKER}-queue", query="", user=member,
                        conversations=other_project.conversations.all())
    dataset_create(project=other_project, name=f"{MARKER}-dataset", user=member)
    return project, other_project, (MARKER.encode(), artifact.artifact_id.encode())


def _shows(content: bytes, markers: tuple[bytes, ...]) -> bool:
    return any(marker in content for marker in markers)


def _body(response) -> bytes:
    # CSV exports stream.
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.mark.parametrize("name, url", LISTS, ids=[name for name, _ in LISTS])
def test_it_shows_no_row_of_another_project_on_a_list(client_in, two_projects, name, url):
    ours, theirs, markers = two_projects
    response = client_in.get(url(ours.slug))
    assert response.status_code == 200, name
    assert not _shows(_body(response), markers), name
    # The same list of the other project does show them: the markers are real probes.
    if name != "tool detail":
        assert _shows(_body(client_in.get(url(theirs.slug))), markers), name


def test_it_counts_only_the_projects_rows_in_the_overview_totals(client_in, two_projects):
    ours, _, _ = two_projects
    content = client_in.get(reverse("web:overview", args=[ours.slug])).content.decode()
    conversations = re.search(r'data-testid="total-conversations">([^<]*)<', content).group(1)
    tool_calls = re.search(r'data-testid="total-tool-calls">([^<]*)<', content).group(1)
    assert (conversations, tool_calls) == ("1", "4")  # full_conversation: 2 rounds x 2 tool calls


def test_it_counts_only_the_projects_calls_in_the_tool_api(client_in, two_projects):
    ours, _, _ = two_projects
    rows = {row["tool_name"]: row["calls"] for row in client_in.get(f"/api/v1/projects/{ours.slug}/tools").json()}
    assert rows == {"query_sales": 2, "load_csv": 2}


def test_it_lists_only_the_projects_conversations_in_the_api(client_in, two_projects):
    ours, _, _ = two_projects
    items = client_in.get(f"/api/v1/projects/{ours.slug}/conversations").json()["items"]
    assert [item["external_id"] for item in items] == ["ours-1"]
