"""OpenTelemetry ``gen_ai.evaluation.result`` events become scores.

The GenAI semantic conventions send an evaluation as an event: a log record named
``gen_ai.evaluation.result`` parented to the evaluated span (or carrying
``gen_ai.response.id`` when there is no span), or, from older emitters, a span event
of that name on the evaluated span. Its attributes: ``gen_ai.evaluation.name``
(required), ``gen_ai.evaluation.score.value``, ``gen_ai.evaluation.score.label``,
``gen_ai.evaluation.explanation``, ``gen_ai.response.id``.

``log_evaluations`` / ``span_evaluations`` read a decoded batch's events and check
each against its name's score config (``judging.rules.score_refusal``, as the API
does); ``evaluations_attach`` adds the scores to the batch's prepared write
(``group_commit.Pending``), so they are stored in the batch's transaction, by the
same store path as the API's (``judging.services.scores_store``), from the sender's
key. A score's id is made from the event's content, so a retried batch stores it once.

An event that makes no score (no name, no value nor label, nothing it judges, outside
its config) is refused, never dropped silently: a log record that is such an event
is rejected (not stored; ``partial_success.rejected_log_records`` counts it and
``error_message`` says why); a span carrying such an event is stored as always (the
span is fine), and ``error_message`` says how many of its events made no score and
why (``rejected_spans`` counts spans, and none was). Either way the refusal is
counted per score name in ``judging.EvaluationRefusal``, which the admin and the
scores page show, since SDK exporters log partial success at best (Python's ignores it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence, TypeVar

from pydantic import ValidationError

from dashboard.accounts.models import Project
from dashboard.judging.models import ScoreSource
from dashboard.judging.rules import score_refusal
from dashboard.judging.services import ERROR_LENGTH, Author, configs_for, evaluation_refusals_count, scores_store
from dashboard.observatory.conventions import text_of
from pipeline import ScoreRecord

from .group_commit import Pending
from .otlp import SpanRow
from .otlp_logs import LogRow
from .scores import validation_message

T = TypeVar("T")
logger = logging.getLogger(__name__)

EVALUATION_EVENT = "gen_ai.evaluation.result"
NAME = "gen_ai.evaluation.name"
VALUE = "gen_ai.evaluation.score.value"
LABEL = "gen_ai.evaluation.score.label"
EXPLANATION = "gen_ai.evaluation.explanation"
RESPONSE_ID = "gen_ai.response.id"


@dataclass
class Evaluations:
    """A batch's evaluation events: the scores they make, and the refused ones, each
    (the position of its log record or span in the batch, its score name, why)."""

    scores: list[ScoreRecord] = field(default_factory=list)
    refused: list[tuple[int, str, str]] = field(default_factory=list)

    def refused_positions(self) -> set[int]:
        return {position for position, _, _ in self.refused}

    def reasons(self) -> list[str]:
        """The distinct reasons, for ``partial_success.error_message``."""
        return list(dict.fromkeys(f"{EVALUATION_EVENT} {reason}" for _, _, reason in self.refused))


def log_evaluations(project: Project, logs: Sequence[LogRow]) -> Evaluations:
    """The scores of a batch's ``gen_ai.evaluation.result`` log records."""
    found = []
    for position, log in enumerate(logs):
        if log.event_name != EVALUATION_EVENT:
            continue
        attributes = log.attributes
        if not isinstance(attributes.get(NAME), str) and isinstance(log.body, dict):
            attributes = {**log.body, **attributes}  # an emitter that put them in the body
        found.append((position, attributes, _score(
            attributes, trace_id=log.trace_id, span_id=log.span_id,
            unix_nano=log.time_unix_nano or log.observed_time_unix_nano,
            conversation=text_of("conversation", log.attributes, log.resource))))
    return _checked(project, found)


def span_evaluations(project: Project, spans: Sequence[SpanRow]) -> Evaluations:
    """The scores of the ``gen_ai.evaluation.result`` events on a batch's spans,
    each judging the span it is on."""
    found = []
    for position, span in enumerate(spans):
        if not span.events:
            continue
        for event in span.events:
            if event.get("name") != EVALUATION_EVENT:
                continue
            attributes = event.get("attributes") or {}
            found.append((position, attributes, _score(
                attributes, trace_id=span.trace_id, span_id=span.span_id,
                unix_nano=event.get("time_unix_nano") or span.end_time_unix_nano,
                conversation=text_of("conversation", span.attributes, span.resource))))
    return _checked(project, found)


def _checked(project: Project, found: list[tuple[int, dict[str, Any], ScoreRecord | str]]) -> Evaluations:
    """The events' scores checked against their names' configs (one query, only
    when the batch has evaluations)."""
    evaluations = Evaluations()
    if not found:
        return evaluations
    configs = configs_for(project, {score.name for _, _, score in found if isinstance(score, ScoreRecord)})
    for position, attributes, score in found:
        if isinstance(score, ScoreRecord):
            refusal = score_refusal(configs.get(score.name), score.value, score.label)
            if refusal is None:
                evaluations.scores.append(score)
                continue
            name, reason = score.name, refusal
        else:
            name = attributes.get(NAME) if isinstance(attributes.get(NAME), str) else ""
            reason = score
        evaluations.refused.append((position, name[:200], reason[:ERROR_LENGTH]))
    return evaluations


def _score(attributes: dict[str, Any], *, trace_id: str, span_id: str, unix_nano: int,
           conversation: str) -> ScoreRecord | str:
    """The score an event makes, or why it makes none."""
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
    if not isinstance(fields["name"], str) or not fields["name"]:
        return f"has no {NAME}"
    fields["score_id"] = "otel-" + hashlib.sha256(json.dumps([fields, unix_nano], sort_keys=True, default=str)
                                                  .encode("utf-8", "replace")).hexdigest()[:40]
    fields["occurred_at"] = _time(unix_nano)
    try:
        return ScoreRecord.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        return validation_message(exc)


def _time(unix_nano: Any) -> datetime:
    """When the evaluation was made; now when the event does not say (or says nonsense)."""
    if isinstance(unix_nano, int) and unix_nano > 0:
        try:
            return datetime.fromtimestamp(unix_nano / 1e9, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            pass
    return datetime.now(timezone.utc)


def evaluations_attach(pending: Pending[T], *, project: Project, key_id: int | None,
                       evaluations: Evaluations) -> Pending[T]:
    """``pending`` whose write also stores the evaluations' scores (in its
    transaction, after its rows, so an evaluation of a span in the same batch finds
    it) and counts the refused ones. A write with evaluations is stored on its own,
    not merged with others of its kind."""
    if not evaluations.scores and not evaluations.refused:
        return pending
    author = Author.of_key(key_id, ScoreSource.OTEL)
    write = pending.write
    refused = [(name, reason) for _, name, reason in evaluations.refused]

    def write_with_scores() -> T:
        result = write() if write is not None else pending.empty
        outcome = scores_store(project=project, scores=evaluations.scores, author=author)
        # A config changed since the batch was checked, or a score id that scores something else.
        late = [(evaluations.scores[item["index"]].name, item["error"]) for item in outcome.rejected]
        if late:
            logger.info("%d gen_ai.evaluation.result events of project %s refused when stored; first: %s",
                        len(late), project.pk, late[0][1])
        evaluation_refusals_count(project=project, refusals=refused + late)
        return result

    return Pending(write_with_scores, pending.rows + len(evaluations.scores), pending.empty)
