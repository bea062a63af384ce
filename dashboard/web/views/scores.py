"""Scores on the pages: give one in place (a conversation, a round, a tool call:
thumbs, a label or value from the project's score configs, a comment), and the
scores summary (per name: distribution, mean over time with drill-down, per tool
and per model).

A member's score is kept under an id made of who, what and the name, so scoring the
same thing again is an edit of their score (kept with its history), never a second
vote. Viewers see scores but may not give them (404, as for what they may not see).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional
from urllib.parse import quote

from django import forms
from django.contrib import messages
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST
from pydantic import ValidationError

from dashboard.accounts.models import Membership, Project
from dashboard.judging.models import EvaluationRefusal, Score, ScoreConfig
from dashboard.judging.rules import ScoreKind
from dashboard.judging.selectors import score_edits, score_groups, score_summary, with_edit_count
from dashboard.judging.services import ScoreRefused, score_from_page, score_hours_refresh
from dashboard.observatory.models import Conversation, Round, ToolExecution
from pipeline import ScoreRecord

from ..access import project_page
from ..forms import RANGES, RangeForm
from ..selectors.series import HOURLY_UP_TO, URL_TIME

FEEDBACK = "feedback"  # the thumbs' score name (boolean)
MAX_PICKS = 11  # a numeric config with at most this many whole values is offered as choices


def may_judge(user: Any, project: Project) -> bool:
    """Owners and members give scores; viewers only read them."""
    return user.is_superuser or Membership.objects.filter(
        project=project, user=user, role__in=(Membership.Role.OWNER, Membership.Role.MEMBER)).exists()


def require_judge(request: HttpRequest, project: Project) -> None:
    """404 for a viewer's change (scores, reviews, datasets): we do not confirm what they may not do."""
    if not may_judge(request.user, project):
        raise Http404("a viewer changes nothing")


def named_create(request: HttpRequest, project: Project, form_class: type[forms.Form],
                 create: Callable[[dict[str, Any]], HttpResponse], refused: type[Exception],
                 ) -> tuple[forms.Form, int, Optional[HttpResponse]]:
    """The making half of a list page that also makes a named thing (a dataset, a
    review queue): on a member's POST of a valid form, ``create(cleaned_data)`` makes
    it and returns the answer (a redirect to it); ``refused`` (the name is taken) is
    the name field's error. Returns the form to show, its status (400 after a bad
    POST), and the answer when made (None: render the list)."""
    if request.method != "POST":
        return form_class(), 200, None
    require_judge(request, project)
    form = form_class(request.POST)
    if form.is_valid():
        try:
            return form, 200, create(form.cleaned_data)
        except refused as exc:
            form.add_error("name", str(exc))
    return form, 400, None


@dataclass(frozen=True)
class Pick:
    value: str  # "<config pk>:<index>"
    text: str


def score_picks(configs: list[ScoreConfig]) -> list[tuple[str, list[Pick]]]:
    """What a member can choose in place, per config: its labels, true/false, or
    the whole values of a small numeric range."""
    picks = []
    for config in configs:
        choices = [text for text, _ in _choices(config)]
        if choices:
            picks.append((config.name, [Pick(f"{config.pk}:{i}", text) for i, text in enumerate(choices)]))
    return picks


def _choices(config: ScoreConfig) -> list[tuple[str, Any]]:
    if config.kind == ScoreKind.BOOLEAN:
        return [("true", True), ("false", False)]
    if config.kind == ScoreKind.CATEGORICAL:
        return [(label, label) for label in config.labels]
    low, high = config.min_value, config.max_value
    if low is not None and high is not None and float(low).is_integer() and float(high).is_integer() \
            and 0 <= high - low < MAX_PICKS:
        return [(f"{value:g}", int(value)) for value in range(int(low), int(high) + 1)]
    return []


class ScoreForm(forms.Form):
    target = forms.ChoiceField(choices=[("conversation", "conversation"), ("round", "round"),
                                        ("tool_call", "tool call")])
    object = forms.IntegerField(min_value=1, max_value=2**62)
    thumb = forms.ChoiceField(required=False, choices=[("", ""), ("up", "up"), ("down", "down")])
    pick = forms.RegexField(required=False, regex=r"^\d{1,18}:\d{1,3}$", max_length=24)
    name = forms.CharField(required=False, max_length=200)
    value = forms.CharField(required=False, max_length=64)
    comment = forms.CharField(required=False, max_length=2000)


@dataclass
class Judged:
    """What a score form names: the object and how a ScoreRecord names it."""

    target: str
    obj: Any
    conversation: Conversation
    fields: dict[str, str]


def judged(project: Project, target: str, pk: int) -> Judged:
    """The project's conversation, round or tool call (404 for another project's)."""
    if target == "conversation":
        conversation = get_object_or_404(Conversation, project=project, pk=pk)
        return Judged(target, conversation, conversation, {"conversation_id": conversation.external_id})
    if target == "round":
        round_ = get_object_or_404(Round.objects.select_related("conversation"), project=project, pk=pk)
        return Judged(target, round_, round_.conversation, {"conversation_id": round_.conversation.external_id,
                                                            "round_id": round_.round_id})
    execution = get_object_or_404(ToolExecution.objects.select_related("conversation").only(
        "id", "project_id", "tool_call_id", "round_id", "conversation__id", "conversation__external_id"),
        project=project, pk=pk)
    return Judged(target, execution, execution.conversation, {"conversation_id": execution.conversation.external_id,
                                                              "tool_call_id": execution.tool_call_id})


def scores_on(item: Judged) -> list[Score]:
    if item.target == "round":
        rows = Score.objects.filter(round=item.obj, tool_execution__isnull=True)
    elif item.target == "tool_call":
        rows = Score.objects.filter(tool_execution=item.obj)
    else:
        rows = Score.objects.filter(conversation=item.obj, round__isnull=True, tool_execution__isnull=True)
    return list(with_edit_count(rows).order_by("occurred_at", "id"))


class _Refused(Exception):
    pass


def _name_and_value(project: Project, data: dict[str, Any], mine: Optional[Score]) -> tuple[str, Any]:
    """The score a submitted form gives: thumbs, else a pick, else a name and a value,
    else (a comment alone) the member's latest score of the thing, commented."""
    if data["thumb"]:
        return FEEDBACK, data["thumb"] == "up"
    if data["pick"]:
        config_pk, index = (int(part) for part in data["pick"].split(":"))
        config = ScoreConfig.objects.filter(project=project, pk=config_pk).first()
        choices = _choices(config) if config is not None else []
        if index >= len(choices):
            raise _Refused("That choice is not offered any more; reload the page.")
        return config.name, choices[index][1]
    name, value = data["name"].strip(), data["value"].strip()
    if not name and not value and data["comment"].strip() and mine is not None:
        return mine.name, (bool(mine.value) if mine.kind == ScoreKind.BOOLEAN else
                           mine.value if mine.value is not None else mine.label)
    if not name or not value:
        raise _Refused("Choose thumbs, a label, or give a score name and a value.")
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    try:
        return name, float(value)
    except ValueError:
        return name, value  # a label


@require_POST
@project_page
def score_add(request: HttpRequest, project: Project) -> HttpResponse:
    require_judge(request, project)
    form = ScoreForm(request.POST)
    if not form.is_valid():
        return _answer(request, project, None, "That score form is not valid.", status=400)
    data = form.cleaned_data
    item = judged(project, data["target"], data["object"])
    error = None
    try:
        mine = next((s for s in reversed(scores_on(item)) if s.author_user_id == request.user.pk
                     and s.source == "ui"), None)
        name, value = _name_and_value(project, data, mine)
        record = ScoreRecord.model_validate({
            "score_id": f"ui:{request.user.pk}:{item.target}:{item.obj.pk}:{name}"[:200], "name": name,
            "value": value, "comment": data["comment"].strip() or None, **item.fields,
        })
        score_from_page(project=project, user=request.user, record=record)
    except (ScoreRefused, _Refused) as exc:
        error = str(exc)
    except ValidationError as exc:
        first = exc.errors()[0]
        error = f"{'.'.join(str(p) for p in first['loc']) or 'score'}: {first['msg'].removeprefix('Value error, ')}"
    return _answer(request, project, item, error)


def _answer(request: HttpRequest, project: Project, item: Optional[Judged], error: Optional[str],
            status: int = 200) -> HttpResponse:
    """htmx: the widget again (with the error, answered 200 so htmx shows it); a
    plain form post: back to the timeline, the error as a message."""
    if item is None:
        return HttpResponse(error or "", status=status, content_type="text/plain")
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "web/partials/scores.html", widget_context(
            project, item.target, item.obj.pk, scores_on(item), may=True, error=error))
    if error:
        messages.error(request, error)
    anchor = {"round": f"#round-{getattr(item.obj, 'index', '')}", "tool_call": f"#exec-{item.obj.pk}"}.get(
        item.target, "")
    return redirect(reverse("web:conversation", args=[project.slug, item.conversation.pk]) + anchor)


def widget_urls(project: Project) -> dict[str, str]:
    """What every score widget of a page posts to and loads its choices from (reversed once a page)."""
    return {"score_add_url": reverse("web:score_add", args=[project.slug]),
            "score_form_url": reverse("web:score_form", args=[project.slug])}


def widget_context(project: Project, target: str, pk: int, scores: list[Score], *, may: bool,
                   error: Optional[str] = None) -> dict[str, Any]:
    return {"project": project, "score_target": target, "score_object": pk, "scores": scores, "may_judge": may,
            "score_error": error, **widget_urls(project)}


@project_page
def score_form(request: HttpRequest, project: Project) -> HttpResponse:
    """The htmx partial: the configs' choices and the name/value fields of one widget."""
    require_judge(request, project)
    form = ScoreForm({"target": request.GET.get("target", ""), "object": request.GET.get("object", "")})
    if form.has_error("target") or form.has_error("object"):
        return HttpResponse("bad target", status=400, content_type="text/plain")
    judged(project, form.cleaned_data["target"], form.cleaned_data["object"])  # 404 for another project's
    return render(request, "web/partials/score_choices.html",
                  {"score_picks": score_picks(list(ScoreConfig.objects.filter(project=project)))})


@project_page
def score_edit_history(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    """The htmx partial: one score's edits (who changed what, when), for anyone who sees the score."""
    score = get_object_or_404(Score.objects.only("id", "project_id", "kind"), project=project, pk=pk)
    edits = [(edit, [(name, _shown(score, name, before), _shown(score, name, after))
                     for name, (before, after) in edit.changes.items()]) for edit in score_edits(score)]
    return render(request, "web/partials/score_edits.html", {"score": score, "edits": edits})


def _shown(score: Score, field: str, value: Any) -> str:
    """A changed field's value as the score's own is shown (a boolean's 1/0 as true/false)."""
    if value is None or value == "":
        return "—"
    if field == "value" and score.kind == ScoreKind.BOOLEAN:
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# --- the summary --------------------------------------------------------------------


@project_page
def score_overview(request: HttpRequest, project: Project) -> HttpResponse:
    form = RangeForm(request.GET)
    hours = form.hours()
    until = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    since = until - timedelta(hours=hours)
    bucket = "hour" if timedelta(hours=hours) <= HOURLY_UP_TO else "day"
    try:
        score_hours_refresh(project=project, since=since, until=until)
    except DatabaseError:  # busy (ingest holds SQLite's write lock): the summary computes those hours itself
        pass
    names = score_summary(project, since=since, until=until, bucket=bucket)
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    conversations = reverse("web:conversations", args=[project.slug])
    charts = []
    for index, summary in enumerate(names):
        links = [f"{conversations}?score={_quoted(summary.name)}&scored_since={start:{URL_TIME}}"
                 f"&scored_until={start + step:{URL_TIME}}" for start, _, _ in summary.series]
        charts.append({
            "id": f"score-series-{index}",
            "data": {"labels": [f"{start:%m-%d %H:%M}" if bucket == "hour" else f"{start:%Y-%m-%d}"
                                for start, _, _ in summary.series],
                     "counts": [count for _, count, _ in summary.series],
                     "means": [mean for _, _, mean in summary.series], "links": links},
        })
        summary.top = max((count for _, count in summary.distribution), default=0)  # type: ignore[attr-defined]
        summary.link = f"{conversations}?score={_quoted(summary.name)}"  # type: ignore[attr-defined]
    return render(request, "web/scores.html", {
        "project": project, "nav_section": "scores", "ranges": list(RANGES), "range": form.label(), "since": since,
        "names": list(zip(names, charts)), "bucket": bucket,
        "by_tool": score_groups(project, since=since, until=until, by="tool"),
        "by_model": score_groups(project, since=since, until=until, by="model"),
        "configs": ScoreConfig.objects.filter(project=project),
        "refusals": EvaluationRefusal.objects.filter(project=project)[:50],
    })


def _quoted(text: str) -> str:
    return quote(text, safe="")
