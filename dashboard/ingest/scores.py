"""``POST /api/v1/scores`` and ``GET /api/v1/scores`` (API key auth).

POST takes a JSON batch ``{"scores": [...]}`` of ``pipeline.ScoreRecord`` items,
validated one by one; the valid ones are stored in one transaction
(``judging.services.scores_store``: a retried score counted as a duplicate, a changed
one as an edit) and the invalid ones listed by index, as the records API does. A
batch of more than OBSERVATORY_MAX_SCORES_PER_BATCH scores is refused (413) from a
count of its objects taken at C speed, before the body is parsed. GET lists the
key's project's scores, newest first, filtered, a page at a time.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal, Optional

from django.conf import settings
from django.db.models import QuerySet
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import ValidationError

from dashboard.judging.models import Score
from dashboard.judging.selectors import ScoreFilters, scores_filtered
from dashboard.judging.services import Author, scores_store
from dashboard.observatory.models import IngestTransport
from dashboard.priority import yield_to_pages
from pipeline import ScoreRecord

from .api import BATCH_REFUSALS, ERROR_LENGTH, ErrorOut, api_key
from .common import (
    IngestBatch,
    IngestError,
    batch_body,
    content_type_required,
    ingest_gate,
    json_decode_cost,
    load_json,
    memory_reserve,
)
from .group_commit import ingest_write

router = Router(tags=["scores"], auth=api_key)
SCORES_JSON_DEPTH = 8  # {"scores": [{...}]}: a score holds no nested object
_YIELD_EVERY = 200
_STRING = re.compile(rb'"[^"]*"')


def _scores_body_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The request body's schema (a list of the pipeline's ScoreRecord) and its
    definitions, which ``dashboard.api`` publishes under components/schemas."""
    item = ScoreRecord.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions = item.pop("$defs", {})
    definitions["ScoreRecord"] = item
    return {
        "type": "object",
        "required": ["scores"],
        "properties": {"scores": {"type": "array", "maxItems": settings.OBSERVATORY_MAX_SCORES_PER_BATCH,
                                  "items": {"$ref": "#/components/schemas/ScoreRecord"}}},
    }, definitions


SCORES_BODY_SCHEMA, SCORE_SCHEMA_DEFINITIONS = _scores_body_schema()


class RejectedScore(Schema):
    index: int
    error: str


class ScoresAnswer(Schema):
    accepted: int
    duplicates: int
    updated: int
    rejected: list[RejectedScore]


@router.post(
    "/scores",
    response={200: ScoresAnswer, **BATCH_REFUSALS},
    summary="Send a batch of scores",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": SCORES_BODY_SCHEMA}},
            "description": "Optionally `Content-Encoding: gzip`. Each score is validated on its own (and against "
            "its name's score config); refused ones are listed in `rejected`, the others stored.",
        }
    },
)
def post_scores(request: HttpRequest) -> dict[str, Any]:
    project = request.auth  # type: ignore[attr-defined]
    content_type_required(request, ("application/json",), "send the scores as application/json")
    batch = IngestBatch(IngestTransport.API, project_id=project.pk, item_name="scores")
    with ingest_gate(batch):
        body = batch_body(request, batch)
        limit = settings.OBSERVATORY_MAX_SCORES_PER_BATCH
        if objects_in(body) - 1 > limit:
            raise IngestError(413, f"too many scores in one batch (at most {limit})")
        items = _score_items(load_json(body, max_depth=SCORES_JSON_DEPTH))
        batch.items = len(items)
        memory_reserve(json_decode_cost(body), "the scores")
        valid, indexes, rejected = scores_validate(items)
        author = Author.of_key(getattr(request, "api_key_id", None))
        outcome = ingest_write(
            lambda: scores_store(project=project, scores=valid, author=author, indexes=indexes), len(valid))
    return {"accepted": outcome.accepted, "duplicates": outcome.duplicates, "updated": outcome.updated,
            "rejected": sorted(rejected + outcome.rejected, key=lambda item: item["index"])}


def objects_in(body: bytes) -> int:
    """How many JSON objects a body holds, counted without parsing it: the ``{``
    outside strings (escaped quotes and backslashes removed first, then the strings)."""
    structure = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return _STRING.sub(b"", structure).count(b"{")


def _score_items(data: Any) -> list[Any]:
    if not isinstance(data, dict):
        raise IngestError(400, "body must be a JSON object")
    items = data.get("scores")
    if not isinstance(items, list):
        raise IngestError(400, 'body needs a "scores" list')
    if len(items) > settings.OBSERVATORY_MAX_SCORES_PER_BATCH:  # lists of numbers have no braces to count
        raise IngestError(413, f"too many scores in one batch (at most {settings.OBSERVATORY_MAX_SCORES_PER_BATCH})")
    return items


def scores_validate(items: list[Any]) -> tuple[list[ScoreRecord], list[int], list[dict[str, Any]]]:
    """The valid scores of a batch with their positions, and the refusals by position."""
    valid: list[ScoreRecord] = []
    indexes: list[int] = []
    rejected: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if index % _YIELD_EVERY == 0:
            yield_to_pages()
        if not isinstance(item, dict):
            rejected.append({"index": index, "error": "a score must be a JSON object"})
            continue
        try:
            valid.append(ScoreRecord.model_validate(item))
            indexes.append(index)
        except ValidationError as exc:
            rejected.append({"index": index, "error": validation_message(exc)})
    return valid, indexes, rejected


def validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return (f"{where}: {message}" if where else message)[:ERROR_LENGTH]


# --- reading ------------------------------------------------------------------------


class ScoreQuery(Schema):
    name: Optional[str] = Field(default=None, max_length=200)
    source: Optional[Literal["api", "ui", "otel"]] = None
    target: Optional[Literal["conversation", "round", "tool_call", "span", "response", "trace"]] = None
    conversation_id: Optional[str] = Field(default=None, max_length=200)
    trace_id: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    span_id: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    tool_call_id: Optional[str] = Field(default=None, max_length=256)
    label: Optional[str] = Field(default=None, max_length=200)
    min_value: Optional[float] = Field(default=None, allow_inf_nan=False)
    max_value: Optional[float] = Field(default=None, allow_inf_nan=False)
    negative: Optional[bool] = None
    linked: Optional[bool] = None
    since: Optional[datetime] = None
    until: Optional[datetime] = None
    before: Optional[int] = Field(default=None, ge=1, description="the `next` of the previous page")
    limit: int = Field(default=100, ge=1, le=500)


class ScoreOut(Schema):
    score_id: str
    name: str
    kind: str
    value: Optional[float] = None
    label: str
    comment: str
    negative: bool
    source: str
    author: str
    occurred_at: datetime
    updated_at: datetime
    target: str
    conversation_id: str
    round_id: str
    tool_call_id: str
    trace_id: str
    span_id: str
    response_id: str
    linked: bool
    edits: int


class ScoresPage(Schema):
    scores: list[ScoreOut]
    next: Optional[int] = None


@router.get("/scores", response={200: ScoresPage, 400: ErrorOut, 401: ErrorOut},
            summary="The key's project's scores, newest first")
def get_scores(request: HttpRequest, filters: Query[ScoreQuery]) -> dict[str, Any]:
    project = request.auth  # type: ignore[attr-defined]
    query = filters.model_dump(exclude={"before", "limit"}, exclude_none=True)
    rows: QuerySet[Score] = scores_filtered(project, ScoreFilters(**query))
    if filters.before is not None:
        rows = rows.filter(pk__lt=filters.before)
    page = list(rows.order_by("-pk").select_related("conversation", "round", "tool_execution")[:filters.limit + 1])
    more = len(page) > filters.limit
    page = page[:filters.limit]
    return {"scores": [_out(score) for score in page], "next": page[-1].pk if more else None}


def _out(score: Score) -> dict[str, Any]:
    return {
        "score_id": score.score_id, "name": score.name, "kind": score.kind, "value": score.value,
        "label": score.label, "comment": score.comment, "negative": score.negative, "source": score.source,
        "author": score.author_name, "occurred_at": score.occurred_at, "updated_at": score.updated_at,
        "target": score.target,
        "conversation_id": score.conversation.external_id if score.conversation else score.conversation_key,
        "round_id": score.round.round_id if score.round else score.round_key,
        "tool_call_id": score.tool_execution.tool_call_id if score.tool_execution else score.tool_call_id,
        "trace_id": score.trace_id, "span_id": score.span_id, "response_id": score.response_id,
        "linked": score.linked, "edits": score.edit_count,
    }
