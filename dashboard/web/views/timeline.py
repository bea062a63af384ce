from __future__ import annotations

import json
from typing import Iterator

from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.accounts.models import Project
from dashboard.judging.selectors import scores_of_conversation
from dashboard.observatory import selectors as observatory
from dashboard.observatory.models import Conversation, Round, ToolExecution

from ..access import project_page
from ..selectors.scores import scores_attach
from .scores import may_judge, widget_urls
from ..selectors.logs import conversation_messages
from ..selectors.timeline import EXPORT_SECTIONS, conversation_for, export_rows, token_budget
from ..selectors.traces import waterfall


def _page_number(request: HttpRequest) -> int:
    try:
        page = int(request.GET.get("page", "1"))
    except ValueError:
        raise Http404("bad page") from None
    if page < 1 or page > 100_000:
        raise Http404("bad page")
    return page


@project_page
def conversation_timeline(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    conversation = conversation_for(project, pk)
    view = observatory.conversation_timeline(conversation, page=_page_number(request))
    first_traced = next((rv.round for rv in view.rounds if rv.round.trace_id), None)
    conversation_scores = scores_attach(view, scores_of_conversation(conversation))
    return render(
        request,
        "web/conversation.html",
        {
            "project": project,
            "nav_section": "conversations",
            "conversation": conversation,
            "timeline": view,
            "budget": token_budget(conversation),
            "waterfall_round": first_traced,
            "waterfall": waterfall(project, first_traced.trace_id, with_details=False) if first_traced else None,
            **dict(zip(("genai_logs", "genai_logs_more", "genai_logs_in_rounds"), conversation_messages(conversation))),
            "conversation_scores": conversation_scores,
            "may_judge": may_judge(request.user, project),
            **widget_urls(project),
        },
    )


@project_page
def round_waterfall(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    """The htmx partial: one round's span waterfall."""
    round_ = get_object_or_404(Round.objects.select_related("conversation"), project=project, pk=pk)
    return render(
        request,
        "web/partials/waterfall.html",
        {
            "project": project,
            "waterfall_round": round_,
            "waterfall": waterfall(project, round_.trace_id, with_details=False) if round_.trace_id else None,
        },
    )


@project_page
def observation(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    """The htmx partial: a tool call's observation, loaded when it is opened."""
    execution = get_object_or_404(
        ToolExecution.objects.only(
            "id", "project_id", "observation", "output_level", "observation_tokens", "data_summary",
            "last_error", "artifact_id",
        ),
        project=project,
        pk=pk,
    )
    return render(request, "web/partials/observation.html", {"project": project, "execution": execution})


@project_page
def conversation_export(request: HttpRequest, project: Project, pk: int) -> StreamingHttpResponse:
    """The whole conversation as one JSON document, streamed section by section so a
    long conversation never sits in memory whole."""
    conversation = conversation_for(project, pk)
    response = StreamingHttpResponse(_export_json(conversation), content_type="application/json")
    filename = f"conversation-{conversation.pk}.json"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _export_json(conversation: Conversation) -> Iterator[str]:
    def dumps(value: object) -> str:
        return json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False)

    header = {
        "conversation_id": conversation.external_id,
        "title": conversation.title,
        "user_id": conversation.user_id,
        "model": conversation.model,
        "status": conversation.status,
        "started_at": conversation.started_at,
        "last_activity_at": conversation.last_activity_at,
        "totals": {
            "rounds": conversation.rounds,
            "messages": conversation.messages,
            "tool_calls": conversation.tool_calls,
            "errors": conversation.errors,
            "retries": conversation.retries,
            "input_tokens": conversation.input_tokens,
            "output_tokens": conversation.output_tokens,
            "max_context_tokens": conversation.max_context_tokens,
            "compressions": conversation.compressions,
        },
    }
    yield '{"conversation": ' + dumps(header)
    for section in EXPORT_SECTIONS:
        yield f', "{section}": ['
        for i, row in enumerate(export_rows(conversation, section)):
            yield ("," if i else "") + dumps(row)
        yield "]"
    yield "}\n"
