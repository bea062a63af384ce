"""OpenTelemetry ``gen_ai.evaluation.result`` events become scores.

The GenAI semantic conventions send an evaluation as an event: a log record named
``gen_ai.evaluation.result`` parented to the evaluated span (or carrying
``gen_ai.response.id`` when there is no span), or, from older emitters, a span event
of that name on the evaluated span. Its attributes: ``gen_ai.evaluation.name``
(required), ``gen_ai.evaluation.score.value``, ``gen_ai.evaluation.score.label``,
``gen_ai.evaluation.explanation``, ``gen_ai.response.id``.

``evaluations_attach`` adds the scores of a decoded batch to its prepared write
(``group_commit.Pending``), so they are stored in the batch's transaction, by the
same store path as the API's (``judging.services.scores_store``), from the sender's
key. The log record or span is stored as always; an event that makes no score (no
name, no value or label, outside its config) is only skipped. A score's id is made
from the event's content, so a retried batch stores it once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime, timezone
from typing import Any, Sequence, TypeVar

from pydantic import ValidationError

from dashboard.accounts.models import Project
from dashboard.judging.models import ScoreSource
from dashboard.judging.services import Author, scores_store
from dashboard.observatory.conventions import text_of
from pipeline import ScoreRecord

from .group_commit import Pending
from .otlp import SpanRow
from .otlp_logs import LogRow

T = TypeVar("T")
logger = logging.getLogger(__name__)

EVALUATION_EVENT = "gen_ai.evaluation.result"
NAME = "gen_ai.evaluation.name"
VALUE = "gen_ai.evaluation.score.value"
LABEL = "gen_ai.evaluation.score.label"
EXPLANATION = "gen_ai.evaluation.explanation"
RESPONSE_ID = "gen_ai.response.id"


def log_evaluations(logs: Sequence[LogRow]) -> list[ScoreRecord]:
    """The scores of a batch's ``gen_ai.evaluation.result`` log records."""
    scores = []
    for log in logs:
        if log.event_name != EVALUATION_EVENT:
            continue
        attributes = log.attributes
        if not isinstance(attributes.get(NAME), str) and isinstance(log.body, dict):
            attributes = {**log.body, **attributes}  # an emitter that put them in the body
        score = _score(attributes, trace_id=log.trace_id, span_id=log.span_id,
                       unix_nano=log.time_unix_nano or log.observed_time_unix_nano,
                       conversation=text_of("conversation", log.attributes, log.resource))
        if score is not None:
            scores.append(score)
    return scores


def span_evaluations(spans: Sequence[SpanRow]) -> list[ScoreRecord]:
    """The scores of the ``gen_ai.evaluation.result`` events on a batch's spans,
    each judging the span it is on."""
    scores = []
    for span in spans:
        if not span.events:
            continue
        for event in span.events:
            if event.get("name") != EVALUATION_EVENT:
                continue
            score = _score(event.get("attributes") or {}, trace_id=span.trace_id, span_id=span.span_id,
                           unix_nano=event.get("time_unix_nano") or span.end_time_unix_nano,
                           conversation=text_of("conversation", span.attributes, span.resource))
            if score is not None:
                scores.append(score)
    return scores


def _score(attributes: dict[str, Any], *, trace_id: str, span_id: str, unix_nano: int,
           conversation: str) -> ScoreRecord | None:
    value = attributes.get(VALUE)
    label = attributes.get(LABEL)
    fields: dict[str, Any] = {
        "name": attributes.get(NAME),
        "value": value if isinstance(value, (int, float)) else None,
        "label": label if isinstance(label, str) and label else None,
        "comment": attributes.get(EXPLANATION) if isinstance(attributes.get(EXPLANATION), str) else None,
        "trace_id": trace_id or None,
        "span_id": span_id or None,
        "response_id": attributes.get(RESPONSE_ID) if isinstance(attributes.get(RESPONSE_ID), str) else None,
        "conversation_id": conversation or None,
    }
    if fields["span_id"] and not fields["trace_id"]:
        fields["span_id"] = None
    fields["score_id"] = "otel-" + hashlib.sha256(json.dumps([fields, unix_nano], sort_keys=True, default=str)
                                                  .encode("utf-8", "replace")).hexdigest()[:40]
    fields["occurred_at"] = _time(unix_nano)
    try:
        return ScoreRecord.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        logger.info("gen_ai.evaluation.result skipped (no score made of it): %s", str(exc)[:200])
        return None


def _time(unix_nano: Any) -> datetime:
    """When the evaluation was made; now when the event does not say (or says nonsense)."""
    if isinstance(unix_nano, int) and unix_nano > 0:
        try:
            return datetime.fromtimestamp(unix_nano / 1e9, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            pass
    return datetime.now(timezone.utc)


def evaluations_attach(pending: Pending[T], *, project: Project, key_id: int | None,
                       scores: list[ScoreRecord]) -> Pending[T]:
    """``pending`` whose write also stores ``scores`` (in its transaction, after its
    rows, so an evaluation of a span in the same batch finds it). A write with
    scores is stored on its own, not merged with others of its kind."""
    if not scores:
        return pending
    author = Author.of_key(key_id, ScoreSource.OTEL)
    write = pending.write

    def write_with_scores() -> T:
        result = write() if write is not None else pending.empty
        outcome = scores_store(project=project, scores=scores, author=author)
        if outcome.rejected:
            logger.info("%d gen_ai.evaluation.result events of project %s made no score; first: %s",
                        len(outcome.rejected), project.pk, outcome.rejected[0]["error"])
        return result

    return Pending(write_with_scores, pending.rows + len(scores), pending.empty)
