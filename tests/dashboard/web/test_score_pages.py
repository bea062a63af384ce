"""Scores on the pages: given in place on the timeline (thumbs, a config's label, a
comment; htmx and plain form posts; CSRF), shown on the timeline, the trace page and
the compare view, filtering the conversation and trace lists (and their saved views
and CSV), and summarised per name, tool and model with numbers equal to a
recomputation from the score rows. Another project's things, viewers and strangers
see or change nothing."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timedelta, timezone

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import PASSWORD, add_span, full_conversation

from dashboard.accounts.models import Membership
from dashboard.accounts.services import membership_add
from dashboard.judging.models import Score, ScoreConfig, ScoreEdit
from dashboard.judging.services import Author, scores_store
from dashboard.observatory.models import Conversation, Round, ToolExecution
from pipeline import ScoreRecord

pytestmark = pytest.mark.django_db
HOSTILE = "<script>alert(1)</script>"
NOW = datetime.now(timezone.utc)


@pytest.fixture
def conversation(project):
    full_conversation(project, "conv-1")
    return Conversation.objects.get(project=project, external_id="conv-1")


def api_scores(project, *records):
    return scores_store(project=project, author=Author.of_key(None),
                        scores=[ScoreRecord(**{"occurred_at": NOW, **r}) for r in records])


def add(client, project, **fields):
    return client.post(reverse("web:score_add", args=[project.slug]), fields, HTTP_HX_REQUEST="true")


def timeline(client, conversation):
    return client.get(reverse("web:conversation", args=[conversation.project.slug, conversation.pk])).content.decode()


# --- in place ---------------------------------------------------------------------------


def test_the_timeline_offers_scoring_on_the_conversation_each_round_and_each_tool_call(client_in, conversation):
    body = timeline(client_in, conversation)
    assert body.count('data-testid="scores-conversation"') == 1
    assert body.count('data-testid="scores-round"') == Round.objects.filter(conversation=conversation).count()
    assert body.count('data-testid="scores-tool_call"') == ToolExecution.objects.filter(
        conversation=conversation).count()
    assert body.count("data-score-up") == body.count("data-score-down") > 0
    assert 'name="csrfmiddlewaretoken"' in body
    assert 'src="/static/js/judging.js"' in body


def test_thumbs_on_a_round_store_a_ui_score_and_a_second_click_edits_it(client_in, project, member, conversation):
    round1 = Round.objects.get(conversation=conversation, round_id="conv-1-r1")
    response = add(client_in, project, target="round", object=round1.pk, thumb="up", comment="clear answer")
    assert response.status_code == 200
    assert f'id="scores-round-{round1.pk}"' in response.content.decode()
    score = Score.objects.get()
    assert (score.name, score.kind, score.value, score.source, score.author_user) == (
        "feedback", "boolean", 1.0, "ui", member)
    assert (score.round, score.conversation, score.comment) == (round1, conversation, "clear answer")

    add(client_in, project, target="round", object=round1.pk, thumb="down")
    score.refresh_from_db()
    assert (Score.objects.count(), score.value, score.negative) == (1, 0.0, True)
    edit = ScoreEdit.objects.get()
    assert edit.by_user == member and edit.changes["value"] == [1.0, 0.0]
    body = timeline(client_in, conversation)
    section = body.split(f'id="scores-round-{round1.pk}"')[1].split("</div>")[0]
    assert "👎 no" in section and "ana" in section


def test_a_tool_call_and_the_conversation_are_scored_where_they_are_shown(client_in, project, conversation):
    call = ToolExecution.objects.filter(conversation=conversation).first()
    add(client_in, project, target="tool_call", object=call.pk, thumb="down", comment=HOSTILE)
    add(client_in, project, target="conversation", object=conversation.pk, thumb="up")
    on_call, on_conversation = Score.objects.get(tool_execution=call), Score.objects.get(round__isnull=True)
    assert on_call.target == "tool_call" and on_conversation.target == "conversation"
    body = timeline(client_in, conversation)
    assert HOSTILE not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    call_widget = body.split(f'id="scores-tool_call-{call.pk}"')[1].split("</div>")[0]
    assert "👎 no" in call_widget


def test_a_label_from_the_config_is_picked_and_a_value_outside_it_is_a_form_error(client_in, project, conversation):
    config = ScoreConfig.objects.create(project=project, name="verdict", kind="categorical",
                                        labels=["correct", "wrong"], negative_labels=["wrong"])
    ScoreConfig.objects.create(project=project, name="stars", kind="numeric", min_value=1, max_value=5)
    round0 = Round.objects.get(conversation=conversation, round_id="conv-1-r0")
    assert f'?target=round&amp;object={round0.pk}"' in timeline(client_in, conversation)  # loaded when opened
    choices = client_in.get(reverse("web:score_form", args=[project.slug]), {"target": "round", "object": round0.pk},
                            HTTP_HX_REQUEST="true").content.decode()
    assert f'value="{config.pk}:1">verdict: wrong</option>' in choices and "stars: 5</option>" in choices
    add(client_in, project, target="round", object=round0.pk, pick=f"{config.pk}:1")
    assert Score.objects.values_list("name", "label", "negative").get() == ("verdict", "wrong", True)

    refused = add(client_in, project, target="round", object=round0.pk, name="stars", value="9")
    assert refused.status_code == 200
    assert "stars must be within 1..5; got 9" in refused.content.decode()
    gone = add(client_in, project, target="round", object=round0.pk, pick=f"{config.pk}:7")
    assert "That choice is not offered any more" in gone.content.decode()
    assert Score.objects.count() == 1


def test_a_comment_alone_comments_the_members_own_score(client_in, project, conversation):
    round0 = Round.objects.get(conversation=conversation, round_id="conv-1-r0")
    alone = add(client_in, project, target="round", object=round0.pk, comment="no score yet")
    assert "Choose thumbs, a label" in alone.content.decode() and not Score.objects.exists()
    add(client_in, project, target="round", object=round0.pk, thumb="down")
    add(client_in, project, target="round", object=round0.pk, comment="the total is wrong")
    score = Score.objects.get()
    assert (score.value, score.comment) == (0.0, "the total is wrong")
    assert ScoreEdit.objects.get().changes == {"comment": ["", "the total is wrong"]}


def test_a_plain_form_post_goes_back_to_the_round(client_in, project, conversation):
    round1 = Round.objects.get(conversation=conversation, round_id="conv-1-r1")
    response = client_in.post(reverse("web:score_add", args=[project.slug]),
                              {"target": "round", "object": round1.pk, "thumb": "up"})
    assert response.status_code == 302
    assert response["Location"].endswith(f"/conversations/{conversation.pk}/#round-{round1.index}")


def test_it_needs_the_csrf_token(client, member, project, conversation):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(member)
    response = strict.post(reverse("web:score_add", args=[project.slug]),
                           {"target": "conversation", "object": conversation.pk, "thumb": "up"})
    assert response.status_code == 403 and not Score.objects.exists()


def test_another_projects_things_viewers_and_strangers_are_404(client, client_in, project, other_project,
                                                                stranger, django_user_model, conversation):
    full_conversation(other_project, "theirs")
    theirs = Round.objects.filter(project=other_project).first()
    assert add(client_in, project, target="round", object=theirs.pk, thumb="up").status_code == 404
    assert add(client_in, project, target="tool_call", object=10**12, thumb="up").status_code == 404
    viewer = django_user_model.objects.create_user("vi", password=PASSWORD)
    membership_add(project=project, user=viewer, role=Membership.Role.VIEWER)
    client.force_login(viewer)
    assert add(client, project, target="conversation", object=conversation.pk, thumb="up").status_code == 404
    assert "data-score-up" not in timeline(client, conversation)
    client.force_login(stranger)
    assert add(client, project, target="conversation", object=conversation.pk, thumb="up").status_code == 404
    assert client.get(reverse("web:scores", args=[project.slug])).status_code == 404
    assert not Score.objects.exists()


@pytest.mark.parametrize("fields", [
    {"target": "span", "object": "1", "thumb": "up"},
    {"target": "round", "object": "-1", "thumb": "up"},
    {"target": "round", "object": "x", "thumb": "up"},
    {"target": "round", "object": "99999999999999999999999", "thumb": "up"},
    {"target": "round", "object": "1", "thumb": "sideways"},
    {"target": "round", "object": "1", "pick": "1:2:3"},
])
def test_a_malformed_score_form_is_a_short_400(client_in, project, fields):
    response = client_in.post(reverse("web:score_add", args=[project.slug]), fields, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and not Score.objects.exists()


def test_scoring_needs_post(client_in, project):
    assert client_in.get(reverse("web:score_add", args=[project.slug])).status_code == 405


@pytest.mark.parametrize("params, status", [
    ({"target": "round", "object": "x"}, 400), ({"target": "span", "object": "1"}, 400), ({}, 400),
    ({"target": "round", "object": "999999"}, 404),
])
def test_the_choices_partial_refuses_what_it_cannot_name(client_in, project, params, status):
    assert client_in.get(reverse("web:score_form", args=[project.slug]), params).status_code == status


def test_the_choices_of_another_projects_round_are_a_404(client_in, project, other_project):
    full_conversation(other_project, "theirs", rounds=1)
    theirs = Round.objects.get(project=other_project)
    response = client_in.get(reverse("web:score_form", args=[project.slug]), {"target": "round", "object": theirs.pk})
    assert response.status_code == 404


def edits_link(body, score):
    return re.search(rf'<a [^>]*href="([^"]*/scores/{score.pk}/edits/)"[^>]*data-testid="score-edited"[^>]*>'
                     r'\s*edited (\d+)×', body)


def test_an_edited_score_shows_how_often_and_its_history_on_demand(client_in, project, member, conversation):
    round1 = Round.objects.get(conversation=conversation, round_id="conv-1-r1")
    add(client_in, project, target="round", object=round1.pk, thumb="up", comment="clear")
    score = Score.objects.get()
    assert edits_link(timeline(client_in, conversation), score) is None  # never edited: nothing to show
    add(client_in, project, target="round", object=round1.pk, thumb="down", comment=HOSTILE)
    api_scores(project, {"score_id": "api-1", "name": "stars", "value": 2, "conversation_id": "conv-1"},)
    api_scores(project, {"score_id": "api-1", "name": "stars", "value": 4, "conversation_id": "conv-1",
                         "comment": HOSTILE})
    stars = Score.objects.get(score_id="api-1")
    body = timeline(client_in, conversation)
    found = edits_link(body, score)
    assert found and found.group(2) == "1" == str(ScoreEdit.objects.filter(score=score).count())
    assert edits_link(body, stars).group(2) == "1"
    history = client_in.get(found.group(1), HTTP_HX_REQUEST="true")
    assert history.status_code == 200
    text = history.content.decode()
    assert text.count('data-testid="score-edit"') == 1 and "ana" in text
    assert "true" in text and "false" in text  # the value before and after
    assert HOSTILE not in text and "&lt;script&gt;" in text


def test_the_trace_page_shows_a_scores_edits(client_in, project, conversation):
    trace = "ab" * 16
    add_span(project, trace, "1" * 16, "agent")
    for value in (0.2, 0.5, 0.9):
        api_scores(project, {"score_id": "rel", "name": "relevance", "value": value, "trace_id": trace,
                             "span_id": "1" * 16})
    score = Score.objects.get(score_id="rel")
    body = client_in.get(reverse("web:trace", args=[project.slug, trace])).content.decode()
    assert edits_link(body, score).group(2) == "2"
    text = client_in.get(edits_link(body, score).group(1)).content.decode()
    assert text.count('data-testid="score-edit"') == 2 and "0.2" in text and "0.9" in text


def test_another_projects_score_history_is_a_404(client, client_in, project, other_project, stranger):
    api_scores(other_project, {"score_id": "x", "name": "stars", "value": 1, "conversation_id": "c"})
    api_scores(other_project, {"score_id": "x", "name": "stars", "value": 2, "conversation_id": "c"})
    theirs = Score.objects.get(project=other_project)
    assert client_in.get(reverse("web:score_edits", args=[project.slug, theirs.pk])).status_code == 404
    assert client_in.get(reverse("web:score_edits", args=[other_project.slug, theirs.pk])).status_code == 404
    assert client_in.get(f"/p/{project.slug}/scores/99999999999999999999999/edits/").status_code == 404
    client.force_login(stranger)
    assert client.get(reverse("web:score_edits", args=[other_project.slug, theirs.pk])).status_code == 200


# --- shown elsewhere ---------------------------------------------------------------------


def test_the_trace_page_lists_its_scores_and_a_trace_with_only_scores_still_opens(client_in, project, conversation):
    trace = "ab" * 16  # round 0's trace
    add_span(project, trace, "1" * 16, "agent")
    api_scores(project, {"name": "relevance", "value": 0.2, "trace_id": trace, "span_id": "1" * 16,
                         "comment": HOSTILE},
               {"name": "orphan", "value": 1, "trace_id": "cd" * 16, "span_id": "2" * 16})
    round0 = Round.objects.get(conversation=conversation, round_id="conv-1-r0")
    add(client_in, project, target="round", object=round0.pk, thumb="up")
    body = client_in.get(reverse("web:trace", args=[project.slug, trace])).content.decode()
    assert body.count('data-testid="trace-score"') == 2 and 'href="#span-1111111111111111"' in body
    assert HOSTILE not in body
    waiting = client_in.get(reverse("web:trace", args=[project.slug, "cd" * 16]))
    assert waiting.status_code == 200
    assert 'data-testid="no-spans"' in waiting.content.decode() and "orphan" in waiting.content.decode()
    assert client_in.get(reverse("web:trace", args=[project.slug, "ef" * 16])).status_code == 404


def test_the_compare_view_sets_the_scores_side_by_side(client_in, project, conversation):
    full_conversation(project, "conv-2")
    api_scores(project, {"name": "stars", "value": 2, "conversation_id": "conv-1"},
               {"name": "stars", "value": 4, "conversation_id": "conv-1", "round_id": "conv-1-r0"},
               {"name": "stars", "value": 5, "conversation_id": "conv-2"})
    other = Conversation.objects.get(external_id="conv-2")
    body = client_in.get(reverse("web:compare", args=[project.slug]) + f"?a={conversation.pk}&b={other.pk}").content.decode()
    row = re.search(r'<tr data-score="stars">(.*?)</tr>', body, re.S).group(1)
    assert "3.000 (2, 0)" in row and "5.000 (1, 0)" in row and ">2.000<" in row


# --- list filters -----------------------------------------------------------------------


@pytest.fixture
def scored(project):
    for name in ("good", "bad", "unscored", "labelled"):
        full_conversation(project, name, rounds=1)
    ScoreConfig.objects.create(project=project, name="stars", kind="numeric", min_value=1, max_value=5)
    api_scores(project, {"name": "stars", "value": 5, "conversation_id": "good"},
               {"name": "stars", "value": 1, "conversation_id": "bad"},
               {"name": "verdict", "label": "wrong", "conversation_id": "labelled"})
    return project


def test_the_conversation_list_filters_by_score(client_in, scored):
    def ids(**params):
        response = client_in.get(reverse("web:conversations", args=[scored.slug]), params)
        assert response.status_code == 200
        return {c.external_id for c in response.context["page"].rows}

    assert ids() == {"good", "bad", "unscored", "labelled"}
    assert ids(score="stars") == {"good", "bad"}
    assert ids(score="stars", score_min=3) == {"good"}
    assert ids(score_max=2) == {"bad"}
    assert ids(negative="on") == {"bad"}
    assert ids(score_label="wrong") == {"labelled"}
    assert ids(score="nothing") == set()
    assert ids(scored_since=(NOW + timedelta(days=2)).strftime("%Y-%m-%d")) == set()


@pytest.mark.parametrize("params", [{"score_min": "abc"}, {"score_min": "5", "score_max": "1"},
                                    {"score": "x" * 201}, {"scored_since": "yesterday"}, {"score_min": "nan"}])
def test_a_bad_score_filter_is_a_400_with_the_form(client_in, scored, params):
    response = client_in.get(reverse("web:conversations", args=[scored.slug]), params)
    assert response.status_code == 400


def test_a_saved_view_keeps_the_score_filters(client_in, scored):
    response = client_in.post(reverse("web:saved_views", args=[scored.slug]), {
        "name": "bad answers", "page": "conversations", "query": "score=stars&score_max=2&negative=on"})
    assert response.status_code == 302
    opened = client_in.get(response["Location"])
    assert {c.external_id for c in opened.context["page"].rows} == {"bad"}


def test_the_csv_export_follows_the_score_filter_and_carries_the_scores(client_in, scored):
    response = client_in.get(reverse("web:conversations_export", args=[scored.slug]), {"score": "stars"})
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert {row["external_id"]: row["scores"] for row in rows} == {"good": "stars=5 (1)", "bad": "stars=1 (1)"}


def test_the_trace_list_filters_by_score(client_in, project):
    for index, trace in enumerate(("a1" * 16, "b2" * 16, "c3" * 16)):
        add_span(project, trace, f"{index + 1:016x}", f"root {index}")
    full_conversation(project, "conv-t", rounds=1, trace_id="c3" * 16)
    api_scores(project, {"name": "relevance", "value": 0.1, "trace_id": "a1" * 16},
               {"name": "relevance", "value": 0.9, "trace_id": "b2" * 16},
               {"name": "thumbs", "value": False, "conversation_id": "conv-t", "round_id": "conv-t-r0"})

    def traces(**params):
        response = client_in.get(reverse("web:traces", args=[project.slug]), params)
        assert response.status_code == 200
        return {row.root.trace_id for row in response.context["page"].rows}

    assert traces(score="relevance") == {"a1" * 16, "b2" * 16}
    assert traces(score="relevance", score_max=0.5) == {"a1" * 16}
    assert traces(negative="on") == {"c3" * 16}  # a round's score, found through the round's trace


# --- the summary ------------------------------------------------------------------------


def test_the_summary_equals_a_recomputation_from_the_score_rows(client_in, project, other_project):
    full_conversation(project, "conv-s", rounds=2)
    ScoreConfig.objects.create(project=project, name="stars", kind="numeric", min_value=1, max_value=5)
    calls = list(ToolExecution.objects.filter(project=project).order_by("pk"))
    values = [1, 2, 2, 4, 5, 5, 3]
    api_scores(project, *[{"name": "stars", "value": v, "conversation_id": "conv-s", "round_id": f"conv-s-r{i % 2}",
                           "occurred_at": NOW - timedelta(hours=i)} for i, v in enumerate(values)])
    api_scores(project, *[{"name": "ok", "value": i % 3 != 0, "tool_call_id": calls[i % len(calls)].tool_call_id,
                           "occurred_at": NOW - timedelta(minutes=i)} for i in range(9)])
    api_scores(project, {"name": "tone", "label": HOSTILE, "conversation_id": "conv-s"})
    api_scores(other_project, {"name": "stars", "value": 5, "conversation_id": "x"})

    response = client_in.get(reverse("web:scores", args=[project.slug]), {"range": "24h"})
    assert response.status_code == 200
    body = response.content.decode()
    assert HOSTILE not in body and "&lt;script&gt;" in body
    names = {summary.name: summary for summary, _ in response.context["names"]}
    rows = Score.objects.filter(project=project)
    for name, summary in names.items():
        mine = list(rows.filter(name=name))
        assert summary.count == len(mine)
        assert summary.negatives == sum(s.negative for s in mine)
        valued = [s.value for s in mine if s.value is not None]
        assert summary.mean == (pytest.approx(sum(valued) / len(valued)) if valued else None)
        assert sum(count for _, count in summary.distribution) == len(mine)
        assert sum(count for _, count, _ in summary.series) == len(mine)
    assert names["stars"].count == 7 and names["stars"].negatives == 3
    assert dict(names["ok"].distribution) == {"true": 6, "false": 3}
    by_tool = {(row.name, row.group): row for row in response.context["by_tool"]}
    for (name, tool), row in by_tool.items():
        mine = [s for s in rows.filter(name=name, tool_execution__tool_name=tool)]
        assert row.count == len(mine) and row.negatives == sum(s.negative for s in mine)
    assert sum(row.count for row in by_tool.values()) == 9
    by_model = {(row.name, row.group): row.count for row in response.context["by_model"]}
    assert by_model[("stars", "gpt-4o")] == 7
    chart = json.loads(re.search(r'<script id="score-series-1" type="application/json">(.*?)</script>', body,
                                 re.S).group(1))
    assert sum(chart["counts"]) == 7 and all("score=stars&scored_since=" in link for link in chart["links"])


def test_a_summary_bucket_drills_down_to_the_conversations_scored_in_it(client_in, project):
    full_conversation(project, "early", rounds=1)
    full_conversation(project, "late", rounds=1)
    hour = NOW.replace(minute=30, second=0, microsecond=0)
    api_scores(project, {"name": "stars", "value": 2, "conversation_id": "early", "occurred_at": hour - timedelta(hours=3)},
               {"name": "stars", "value": 4, "conversation_id": "late", "occurred_at": hour})
    response = client_in.get(reverse("web:scores", args=[project.slug]), {"range": "24h"})
    chart = response.context["names"][0][1]["data"]
    scored = [i for i, count in enumerate(chart["counts"]) if count]
    assert [chart["counts"][i] for i in scored] == [1, 1] and [chart["means"][i] for i in scored] == [2.0, 4.0]
    assert scored[1] - scored[0] == 3  # the hours between are there, empty
    first, second = (client_in.get(chart["links"][i]).context["page"].rows for i in scored)
    assert [c.external_id for c in first] == ["early"] and [c.external_id for c in second] == ["late"]
    assert not client_in.get(chart["links"][scored[0] + 1]).context["page"].rows


@pytest.mark.parametrize("range_, step, points", [("24h", timedelta(hours=1), 24), ("7d", timedelta(hours=1), 168),
                                                  ("30d", timedelta(days=1), (30, 31))])
def test_the_summary_series_has_every_bucket_of_the_range_equal_to_the_rows(client_in, project, range_, step,
                                                                           points):
    full_conversation(project, "c", rounds=1)
    api_scores(project, *[{"name": "stars", "value": v, "conversation_id": "c", "occurred_at": NOW - ago}
                          for v, ago in ((1, timedelta(hours=2)), (3, timedelta(hours=2, minutes=5)),
                                         (5, timedelta(hours=20)), (2, timedelta(days=4)))])
    response = client_in.get(reverse("web:scores", args=[project.slug]), {"range": range_})
    summary = response.context["names"][0][0]
    starts = [start for start, _, _ in summary.series]
    assert len(starts) in (points if isinstance(points, tuple) else (points,))
    assert all(b - a == step for a, b in zip(starts, starts[1:]))  # no bucket missing
    assert starts[0] <= response.context["since"] < starts[0] + step
    for start, count, mean in summary.series:
        mine = [s.value for s in Score.objects.filter(project=project, occurred_at__gte=start,
                                                      occurred_at__lt=start + step)]
        assert count == len(mine)
        assert mean == (pytest.approx(sum(mine) / len(mine)) if mine else None)
    assert sum(count for _, count, _ in summary.series) == summary.count
    chart = response.context["names"][0][1]["data"]
    assert len(chart["counts"]) == len(chart["means"]) == len(chart["links"]) == len(starts)
    assert None in chart["means"] and 0 in chart["counts"]


def test_the_summary_is_empty_without_scores(client_in, project):
    body = client_in.get(reverse("web:scores", args=[project.slug])).content.decode()
    assert 'data-testid="no-scores"' in body


def test_the_summary_shows_the_evaluations_ingest_refused_of_its_project_only(client_in, project, other_project):
    from dashboard.judging.services import evaluation_refusals_count

    evaluation_refusals_count(project=project, refusals=[("stars", "stars must be within 1..5; got 9"),
                                                         (HOSTILE, "no value"), ("stars", "got 0")])
    evaluation_refusals_count(project=other_project, refusals=[("theirs", "secret reason")])
    body = client_in.get(reverse("web:scores", args=[project.slug])).content.decode()
    rows = re.findall(r'<tr data-testid="evaluation-refusal">(.*?)</tr>', body, re.S)
    assert len(rows) == 2 and any("stars" in row and ">2<" in row and "got 0" in row for row in rows)
    assert HOSTILE not in body and "theirs" not in body and "secret reason" not in body
