"""Storing scores (judging.services.scores_store): linked to the rows they judge when
those are stored, and later when they arrive (the scores' link pass, through the
real ingest path and outbox); checked against their configs; a retry stored once;
an edit kept with who made it; another project's rows never linked."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from tests.dashboard.web.pages_factories import full_conversation, round_record, store

from dashboard.accounts.services import apikey_create
from dashboard.judging.models import Score, ScoreConfig, ScoreEdit
from dashboard.judging.services import Author, ScoreRefused, score_from_page, scores_store
from dashboard.observatory.models import Conversation, Round, ToolExecution
from pipeline import ScoreRecord

from .spans import LLM0, LLM1, TOOL, TRACE, agent_spans, send

pytestmark = pytest.mark.django_db

AT = datetime(2026, 3, 1, 12, tzinfo=timezone.utc)


def score(**fields) -> ScoreRecord:
    return ScoreRecord(**{"name": "helpfulness", "value": 4, "occurred_at": AT, "conversation_id": "conv-1", **fields})


@pytest.fixture
def key_author(project):
    key, _ = apikey_create(project=project, name="evaluator")
    return Author.of_key(key.pk)


def test_it_links_scores_to_the_conversation_round_and_tool_call_they_name(project, key_author):
    full_conversation(project, "conv-1")
    conversation = Conversation.objects.get(project=project, external_id="conv-1")
    round1 = Round.objects.get(conversation=conversation, round_id="conv-1-r1")
    call = ToolExecution.objects.filter(conversation=conversation, round_id="conv-1-r1").first()

    outcome = scores_store(project=project, author=key_author, scores=[
        score(conversation_id="conv-1"),
        score(conversation_id="conv-1", round_id="conv-1-r1"),
        score(tool_call_id=call.tool_call_id),
        score(trace_id="ab" * 16),  # the trace of round 0
    ])

    assert (outcome.accepted, outcome.duplicates, outcome.rejected) == (4, 0, [])
    rows = {s.target: s for s in Score.objects.filter(project=project)}
    assert rows["conversation"].conversation == conversation and rows["conversation"].round is None
    assert (rows["round"].conversation, rows["round"].round) == (conversation, round1)
    assert (rows["tool_call"].tool_execution, rows["tool_call"].round, rows["tool_call"].conversation) == (
        call, round1, conversation)
    assert rows["trace"].round == Round.objects.get(conversation=conversation, round_id="conv-1-r0")
    assert all(s.source == "api" and s.author_key_id == key_author.key_id for s in rows.values())
    assert rows["conversation"].author_name.startswith("key evaluator (po_")


def test_it_links_a_span_score_to_the_tool_call_or_round_of_that_span(client, project, api_key):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}
    spans = agent_spans("conv-s")
    send(client, auth, *spans.values())
    author = Author.of_key(None)
    scores_store(project=project, author=author, scores=[
        score(score_id="tool", trace_id=TRACE, span_id=TOOL),
        score(score_id="llm1", trace_id=TRACE, span_id=LLM1),
        score(score_id="root", trace_id=TRACE, span_id="1" * 16),
    ])
    tool, llm1, root = (Score.objects.get(score_id=name) for name in ("tool", "llm1", "root"))
    assert tool.tool_execution.tool_call_id == "call_1" and tool.round.span_id == LLM0
    assert (llm1.round.span_id, llm1.tool_execution) == (LLM1, None)
    # the agent span is neither: its conversation, no round (the trace has two)
    assert (root.conversation.external_id, root.round, root.tool_execution) == ("conv-s", None, None)


def test_it_links_a_score_that_arrived_before_its_spans_when_they_come(client, project, api_key):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}
    scores_store(project=project, author=Author.of_key(None), scores=[
        score(score_id="early-tool", trace_id=TRACE, span_id=TOOL),
        score(score_id="early-round", trace_id=TRACE, span_id=LLM1),
        score(score_id="never", trace_id="cd" * 16, span_id="5" * 16),
    ])
    assert not Score.objects.filter(conversation__isnull=False).exists()

    spans = agent_spans("conv-late")
    send(client, auth, spans["llm0"], spans["tool"], spans["llm1"])  # children first, naming span last
    send(client, auth, spans["root"])

    early_tool, early_round, never = (Score.objects.get(score_id=name)
                                      for name in ("early-tool", "early-round", "never"))
    assert early_tool.tool_execution.tool_call_id == "call_1"
    assert early_tool.conversation.external_id == "conv-late"
    assert early_round.round.span_id == LLM1
    # a span that never arrives: kept as sent, under its trace
    assert (never.conversation, never.trace_id, never.span_id) == (None, "cd" * 16, "5" * 16)


def test_it_links_a_score_that_arrived_before_its_conversation(project):
    scores_store(project=project, author=Author.of_key(None), scores=[
        score(score_id="c", conversation_id="conv-2"), score(score_id="r", conversation_id="conv-2", round_id="conv-2-r0"),
    ])
    from dashboard.observatory.derive.drain import outbox_drain_all
    from dashboard.observatory.derive.notes import derivations_enqueue

    outcome = store(project, [round_record("conv-2", 0)])
    derivations_enqueue(project_id=project.pk, conversation_ids=outcome.conversation_ids)
    outbox_drain_all()

    conversation = Conversation.objects.get(project=project, external_id="conv-2")
    assert Score.objects.get(score_id="c").conversation == conversation
    assert Score.objects.get(score_id="r").round == Round.objects.get(conversation=conversation)


def test_the_link_pass_of_a_project_nobody_judges_is_one_query(project, other_project):
    """What a batch names is read only when the project has scores: in the soak (no
    judging) those reads were 6 % of the drainer. Another project's waiting score
    does not make this project's pass read."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.judging.links import scores_link
    from dashboard.observatory.derive.batch import Batch

    scores_store(project=other_project, author=Author.of_key(None), scores=[score(score_id="elsewhere")])
    store(project, [round_record("conv-3", 0)])
    conversation = Conversation.objects.get(project=project, external_id="conv-3")
    batch = Batch(project_id=project.pk, since=AT - timedelta(days=1), until=datetime.now(timezone.utc))
    batch.conversation_ids.add(conversation.pk)
    with CaptureQueriesContext(connection) as queries:
        scores_link(batch)
    assert len(queries) == 1, [query["sql"] for query in queries]

    scores_store(project=project, author=Author.of_key(None), scores=[score(score_id="late", conversation_id="conv-4")])
    Score.objects.filter(score_id="late").update(conversation_key="conv-3")  # waiting for conv-3's row
    with CaptureQueriesContext(connection) as queries:
        scores_link(batch)
    assert len(queries) > 1
    assert Score.objects.get(score_id="late").conversation == conversation


def test_it_finds_the_record_round_again_when_it_replaces_a_derived_one(client, project, api_key):
    """A derived round that a record describes is deleted (span_rows); its score
    follows the record's round, found by the same trace."""
    auth = {"HTTP_AUTHORIZATION": f"Bearer {api_key}"}
    spans = agent_spans("conv-r")
    send(client, auth, spans["root"], spans["llm0"])
    scores_store(project=project, author=Author.of_key(None), scores=[score(score_id="s", trace_id=TRACE, span_id=LLM0)])
    assert Score.objects.get(score_id="s").round.source == "span"

    from dashboard.observatory.derive.drain import outbox_drain_all
    from dashboard.observatory.derive.notes import derivations_enqueue

    outcome = store(project, [round_record("conv-r", 0, trace_id=TRACE)])
    derivations_enqueue(project_id=project.pk, conversation_ids=outcome.conversation_ids)
    outbox_drain_all()

    linked = Score.objects.get(score_id="s").round
    assert linked is not None and linked.source == "record" and linked.trace_id == TRACE


def test_it_never_links_a_score_to_another_projects_rows(project, other_project):
    full_conversation(other_project, "conv-1")
    call = ToolExecution.objects.filter(project=other_project).first()
    scores_store(project=project, author=Author.of_key(None), scores=[
        score(score_id="a", conversation_id="conv-1"), score(score_id="b", tool_call_id=call.tool_call_id),
        score(score_id="c", trace_id="ab" * 16),
    ])
    assert not Score.objects.filter(project=project).exclude(conversation=None).exists()
    assert not Score.objects.filter(project=project).exclude(tool_execution=None, round=None).exists()


def test_it_stores_a_retried_score_once(project):
    batch = [score(score_id="s-1"), score(score_id="s-2", value=2)]
    first = scores_store(project=project, author=Author.of_key(None), scores=batch)
    again = scores_store(project=project, author=Author.of_key(None), scores=batch)
    assert (first.accepted, first.duplicates, again.accepted, again.duplicates) == (2, 0, 0, 2)
    assert Score.objects.count() == 2 and not ScoreEdit.objects.exists()


def test_a_retry_without_a_time_is_the_same_score(project):
    """A sender that leaves occurred_at out gets the server's time; its retry is still a duplicate."""
    data = {"score_id": "s-1", "name": "helpfulness", "value": 4, "conversation_id": "conv-1"}
    scores_store(project=project, author=Author.of_key(None), scores=[ScoreRecord(**data)])
    again = scores_store(project=project, author=Author.of_key(None), scores=[ScoreRecord(**data)])
    assert (again.accepted, again.duplicates, again.updated) == (0, 1, 0)


def test_an_edit_keeps_who_changed_what(project, member, key_author):
    scores_store(project=project, author=key_author, scores=[score(score_id="s-1", value=2, comment="meh")])
    outcome = scores_store(project=project, author=Author.of_user(member),
                           scores=[score(score_id="s-1", value=5, comment="on reflection, great")])
    assert (outcome.accepted, outcome.updated) == (0, 1)
    row = Score.objects.get(score_id="s-1")
    assert (row.value, row.comment, row.author_key_id) == (5.0, "on reflection, great", key_author.key_id)
    (edit,) = row.edits.all()
    assert (edit.by_user, edit.by_name, edit.source) == (member, "ana", "ui")
    assert edit.changes == {"value": [2.0, 5.0], "comment": ["meh", "on reflection, great"]}


def test_it_refuses_moving_a_score_id_to_another_target(project):
    scores_store(project=project, author=Author.of_key(None), scores=[score(score_id="s-1", conversation_id="a")])
    outcome = scores_store(project=project, author=Author.of_key(None),
                           scores=[score(score_id="s-1", conversation_id="b")])
    assert outcome.rejected == [{"index": 0, "error": "score_id 's-1' already scores another conversation; "
                                                      "send a new score_id"}]
    assert Score.objects.get(score_id="s-1").conversation_key == "a"


def test_it_refuses_scores_outside_their_config_and_stores_the_rest(project):
    ScoreConfig.objects.create(project=project, name="helpfulness", kind="numeric", min_value=1, max_value=5)
    ScoreConfig.objects.create(project=project, name="verdict", kind="categorical", labels=["good", "bad"],
                               negative_labels=["bad"])
    outcome = scores_store(project=project, author=Author.of_key(None), scores=[
        score(score_id="ok", value=2, conversation_id="c"),
        score(score_id="high", value=9, conversation_id="c"),
        score(score_id="bad", name="verdict", value=None, label="bad", conversation_id="c"),
        score(score_id="odd", name="verdict", value=None, label="odd", conversation_id="c"),
    ], indexes=[10, 11, 12, 13])
    assert outcome.accepted == 2
    assert outcome.rejected == [
        {"index": 11, "error": "helpfulness must be within 1..5; got 9"},
        {"index": 13, "error": "verdict has no label 'odd'; its labels are 'good', 'bad'"},
    ]
    assert set(Score.objects.values_list("score_id", "kind", "negative")) == {
        ("ok", "numeric", True), ("bad", "categorical", True)}


def test_it_reads_kinds_without_a_config(project):
    scores_store(project=project, author=Author.of_key(None), scores=[
        score(score_id="b", value=False, conversation_id="c"), score(score_id="n", value=0.25, conversation_id="c"),
        score(score_id="l", value="fine", conversation_id="c"),
    ])
    assert {s.score_id: (s.kind, s.value, s.label, s.negative, s.shown_value) for s in Score.objects.all()} == {
        "b": ("boolean", 0.0, "", True, "false"), "n": ("numeric", 0.25, "", False, "0.25"),
        "l": ("categorical", None, "fine", False, "fine"),
    }


def test_a_page_score_out_of_config_is_refused_with_the_reason(project, member):
    ScoreConfig.objects.create(project=project, name="helpfulness", kind="numeric", min_value=1, max_value=5)
    with pytest.raises(ScoreRefused, match="within 1..5"):
        score_from_page(project=project, user=member, record=score(value=6, conversation_id="c"))
    assert not Score.objects.exists()


def test_it_stores_many_scores_in_a_few_queries(project):
    """Reads do not grow with the batch (the inserts go in the backend's bulk chunks)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    full_conversation(project, "conv-1")
    batch = [score(score_id=str(uuid.uuid4()), conversation_id="conv-1", round_id=f"conv-1-r{i % 2}",
                   occurred_at=AT + timedelta(seconds=i)) for i in range(300)]
    with CaptureQueriesContext(connection) as captured:
        outcome = scores_store(project=project, author=Author.of_key(None), scores=batch)
    assert outcome.accepted == 300
    assert len([q for q in captured.captured_queries if not q["sql"].startswith("INSERT")]) <= 8
    assert Score.objects.filter(round__isnull=False).count() == 300
