"""Writes for the stored conversation data: records, artifacts, retention.

``records_store`` is the ingest fast path: a fixed number of queries per batch
whatever its size (get-or-create the conversations in bulk, then one bulk insert
per record type that skips record ids already stored), all in the caller's
transaction. Everything derived is left to the derivation passes, noted in the
same transaction by ``derivations_enqueue`` (derive.notes).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import IO, Any, Sequence

from django.conf import settings
from django.core.files.base import File
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.metrics.models import MetricHour, MetricSeries
from dashboard.tuning.models import RetentionPolicy
from pipeline import (
    CompressionRecord,
    MessageAction,
    MessageRecord,
    OutputLevel,
    RoundRecord,
    SkillActivationRecord,
    ToolResultRecord,
)

from .models import (
    Artifact,
    CompressionEvent,
    Conversation,
    ConversationMinute,
    LogRecord,
    Message,
    Round,
    SkillActivation,
    Span,
    ToolExecution,
    ToolHourlyRollup,
    ToolMinuteRollup,
    TraceConversation,
    UsageHourlyRollup,
    artifact_file_name,
    artifact_storage,
    minute_of,
)
from .derive.notes import derivations_enqueue
from .partitions import span_retention_cutoff
from .rows import conversations_get_or_create, insert_ignoring_conflicts


@dataclass
class StoreOutcome:
    accepted: int = 0
    duplicates: int = 0
    conversation_ids: set[int] = field(default_factory=set)
    tool_minutes: set[datetime] = field(default_factory=set)  # of the tool results stored


# --- records ----------------------------------------------------------------------

def _common(record: Any, project: Project, conversation_id: int) -> dict[str, Any]:
    return {
        "record_id": record.record_id,
        "schema_version": record.schema_version,
        "project_id": project.pk,
        "conversation_id": conversation_id,
        "occurred_at": record.occurred_at,
    }


def _round_row(record: RoundRecord, common: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **common,
        round_id=record.round_id,
        index=record.index,
        trace_id=record.trace_id or "",
        model=record.model or "",
        user_id=record.user_id or "",
        user_message=record.user_message,
        thoughts=list(record.thoughts),
        final_answer=record.final_answer,
        status=record.status,
        context_tokens=record.context_tokens,
        context_window=record.context_window,
        compression_threshold=record.compression_threshold,
        input_tokens=record.input_tokens,
        output_tokens=record.output_tokens,
        started_at=record.started_at,
        ended_at=record.ended_at,
        derived_context_tokens=record.context_tokens,
    )


def _message_row(record: MessageRecord, common: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **common,
        round_id=record.round_id or "",
        index=record.index,
        role=record.role,
        content=record.content,
        name=record.name or "",
        tool_calls=[call.model_dump(mode="json") for call in record.tool_calls],
        tool_call_id=record.tool_call_id or "",
        is_meta=record.is_meta,
        tokens=record.tokens,
    )


def _tool_row(record: ToolResultRecord, common: dict[str, Any]) -> dict[str, Any]:
    result = record.result
    renderings = {r.level: r for r in record.renderings}
    brief = renderings.get(OutputLevel.BRIEF)
    standard = renderings.get(OutputLevel.STANDARD)
    full = renderings.get(OutputLevel.FULL)
    return dict(
        **common,
        round_id=record.round_id or "",
        trace_id=record.trace_id or "",
        span_id=record.span_id or "",
        tool_name=record.tool_name,
        tool_version=record.tool_version,
        parameters=record.parameters,
        model=record.model or "",
        tool_call_id=result.tool_call_id,
        observation=result.observation,
        output_level=result.output_level.value,
        artifact_id=result.artifact_id or "",
        data_size_bytes=result.data_size_bytes,
        data_hash=(result.data_hash or "")[:200],
        data_summary=result.data_summary or "",
        retry_count=result.retry_count,
        last_error=result.last_error or "",
        success=result.success,
        error_code=(result.error_code or "")[:200],
        error_type=(result.error_type or "")[:200],
        error_message=result.error_message or "",
        duration_ms=result.duration_ms,
        observation_tokens=result.observation_tokens,
        cache_hit=result.cache_hit,
        brief_observation=brief.observation if brief else None,
        brief_tokens=brief.tokens if brief else None,
        standard_observation=standard.observation if standard else None,
        standard_tokens=standard.tokens if standard else None,
        full_observation=full.observation if full else None,
        full_tokens=full.tokens if full else None,
    )


def _compression_row(record: CompressionRecord, common: dict[str, Any]) -> dict[str, Any]:
    result = record.result
    return dict(
        **common,
        round_id=record.round_id or "",
        trace_id=record.trace_id or "",
        span_id=record.span_id or "",
        result=result.model_dump(mode="json"),
        mode=result.mode.value,
        requested_mode=result.requested_mode.value if result.requested_mode else "",
        model=(result.model or "")[:200],
        target_tokens=result.target_tokens,
        tokens_before=result.tokens_before,
        tokens_after=result.tokens_after,
        messages_before=result.messages_before,
        messages_after=result.messages_after,
        kept_count=result.count(MessageAction.KEPT),
        dropped_count=result.count(MessageAction.DROPPED),
        truncated_count=result.count(MessageAction.TRUNCATED),
        summarized_count=result.count(MessageAction.SUMMARIZED),
        target_met=result.target_met,
        duration_ms=result.duration_ms,
    )


def _skill_row(record: SkillActivationRecord, common: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **common,
        round_id=record.round_id or "",
        trace_id=record.trace_id or "",
        span_id=record.span_id or "",
        skill_name=record.skill_name,
        activation_id=record.activation_id,
        load_level=record.load_level,
        depth=record.depth,
        chain=list(record.chain),
        tokens_loaded=record.tokens_loaded,
        resources=list(record.resources),
        success=record.success,
        error=record.error,
        duration_ms=record.duration_ms,
    )


# Each builder returns a row as {attname: value}; columns left out take their default.
_ROW_BUILDERS: dict[str, tuple[type[models.Model], Any]] = {
    "round": (Round, _round_row),
    "message": (Message, _message_row),
    "tool_result": (ToolExecution, _tool_row),
    "compression": (CompressionEvent, _compression_row),
    "skill_activation": (SkillActivation, _skill_row),
}


def records_store(*, project: Project, records: Sequence[Any]) -> StoreOutcome:
    """Store validated pipeline records (``pipeline.parse_record`` output).

    Must run inside a transaction (the caller's ``atomic``) so the batch is stored
    whole or not at all. A record whose record_id is already stored for the
    project, or repeated within the batch, counts as a duplicate: the insert skips
    it (ON CONFLICT DO NOTHING) and the row count tells how many were new, so no
    query looks the ids up first.
    """
    outcome = StoreOutcome()
    by_type: dict[str, list[Any]] = {}
    seen_ids: set[uuid.UUID] = set()
    first_seen: dict[str, tuple[datetime, datetime]] = {}
    for record in records:
        if record.record_id in seen_ids:
            outcome.duplicates += 1
            continue
        seen_ids.add(record.record_id)
        by_type.setdefault(record.type, []).append(record)
        moment = record.occurred_at
        seen = first_seen.get(record.conversation_id)
        first_seen[record.conversation_id] = (moment, moment) if seen is None else (
            min(seen[0], moment), max(seen[1], moment)
        )
    if not first_seen:
        return outcome
    conversations = conversations_get_or_create(project=project, first_seen=first_seen)

    for record_type, items in by_type.items():
        model, build = _ROW_BUILDERS[record_type]
        rows = [build(record, _common(record, project, conversations[record.conversation_id])) for record in items]
        inserted = insert_ignoring_conflicts(model, rows)
        outcome.accepted += inserted
        outcome.duplicates += len(rows) - inserted
        if inserted:
            # Which rows were new is not known, only how many: deriving the
            # conversations of duplicates too is harmless (derivations recompute).
            outcome.conversation_ids.update(row["conversation_id"] for row in rows)
            if record_type == "tool_result":
                outcome.tool_minutes.update(minute_of(record.occurred_at) for record in items)
    return outcome


# --- artifacts --------------------------------------------------------------------

class ArtifactConflict(Exception):
    """The artifact id is stored with other content (a different sha256)."""


class ArtifactHashMismatch(Exception):
    """The uploaded bytes do not hash to the sha256 the client declared."""


class ArtifactTooLarge(Exception):
    """The upload is past the artifact size limit."""


@dataclass
class ArtifactOutcome:
    artifact: Artifact
    created: bool


def artifact_store(
    *,
    project: Project,
    artifact_id: str,
    stream: IO[bytes],
    sha256: str,
    content_type: str,
    max_bytes: int,
    chunk_size: int = 1024 * 1024,
) -> ArtifactOutcome:
    """Stream an upload to the artifacts storage under a generated name, checking its
    size and hash as it goes; keep it only when the hash matches.

    Same id and same hash again: the stored artifact, unchanged (created=False).
    Same id, other hash: ArtifactConflict, nothing stored.
    """
    sha256 = sha256.lower()
    checked = _HashingReader(stream, max_bytes, chunk_size)
    existing = Artifact.objects.filter(project=project, artifact_id=artifact_id).first()
    if existing is not None:
        if existing.sha256 != sha256:
            raise ArtifactConflict(artifact_id)
        checked.consume()  # the bytes must still be what the client says they are
        if checked.hexdigest() != sha256:
            raise ArtifactHashMismatch(artifact_id)
        return ArtifactOutcome(existing, created=False)

    storage = artifact_storage
    name = artifact_file_name(project.pk)
    try:
        name = storage.save(name, File(checked, name="upload"))
        if checked.hexdigest() != sha256:
            raise ArtifactHashMismatch(artifact_id)
        policy = RetentionPolicy.objects.filter(project=project).first()
        days = policy.artifact_days if policy else settings.OBSERVATORY_RETENTION_ARTIFACT_DAYS
        artifact = Artifact(
            project=project,
            artifact_id=artifact_id,
            file=name,
            sha256=sha256,
            size=checked.size,
            content_type=content_type[:200] or "application/octet-stream",
            expires_at=timezone.now() + timedelta(days=days),
        )
        with transaction.atomic():
            artifact.save()
    except IntegrityError:
        storage.delete(name)
        # A concurrent upload of the same id won: answer as for a re-upload.
        winner = Artifact.objects.get(project=project, artifact_id=artifact_id)
        if winner.sha256 != sha256:
            raise ArtifactConflict(artifact_id) from None
        return ArtifactOutcome(winner, created=False)
    except BaseException:
        storage.delete(name)  # a partial or refused file never stays behind
        raise
    derivations_enqueue(project_id=project.pk, artifact_ids=[artifact_id])
    return ArtifactOutcome(artifact, created=True)


class _HashingReader:
    """A file-like reader over the request stream that hashes, counts and stops at
    the size limit (raising ArtifactTooLarge) while the storage copies it."""

    def __init__(self, stream: IO[bytes], max_bytes: int, chunk_size: int) -> None:
        self._stream = stream
        self._max = max_bytes
        self._hash = hashlib.sha256()
        self.size = 0
        self.chunk_size = chunk_size

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.chunk_size
        chunk = self._stream.read(min(n, self._max + 1 - self.size) or 1)
        self.size += len(chunk)
        if self.size > self._max:
            raise ArtifactTooLarge()
        self._hash.update(chunk)
        return chunk

    def consume(self) -> None:
        while self.read(self.chunk_size):
            pass

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


# --- retention --------------------------------------------------------------------

@dataclass
class PurgeOutcome:
    spans: int = 0
    records: int = 0
    conversations: int = 0
    artifacts: int = 0
    log_records: int = 0


def retention_purge(*, project: Project, now: datetime | None = None) -> PurgeOutcome:
    """Delete what is older than the project's retention (or the settings' defaults):
    spans by start time, record rows by occurrence, conversations with no activity
    left, artifacts past their expiry or retention, their files included.
    Idempotent: a second run finds nothing more to delete."""
    now = now or timezone.now()
    policy = RetentionPolicy.objects.filter(project=project).first()
    span_days = policy.span_days if policy else settings.OBSERVATORY_RETENTION_SPAN_DAYS
    record_days = policy.record_days if policy else settings.OBSERVATORY_RETENTION_RECORD_DAYS
    artifact_days = policy.artifact_days if policy else settings.OBSERVATORY_RETENTION_ARTIFACT_DAYS
    outcome = PurgeOutcome()

    # On PostgreSQL the days past every project's retention are dropped whole first
    # (partitions.spans_partitions_drop, by purge_expired); these deletes take the rest.
    span_cutoff = span_retention_cutoff(span_days, now)
    outcome.spans, _ = Span.objects.filter(project=project, start_time__lt=span_cutoff).delete()
    # OTLP log records live as long as spans (by arrival: a record's own time may be missing).
    outcome.log_records, _ = LogRecord.objects.filter(
        project=project, received_at__lt=now - timedelta(days=span_days)
    ).delete()
    record_cutoff = now - timedelta(days=record_days)
    for model in (Round, Message, ToolExecution, CompressionEvent, SkillActivation):
        deleted, _ = model.objects.filter(project=project, occurred_at__lt=record_cutoff).delete()
        outcome.records += deleted
    ToolHourlyRollup.objects.filter(project=project, hour__lt=record_cutoff - timedelta(hours=1)).delete()
    ToolMinuteRollup.objects.filter(project=project, minute__lt=record_cutoff - timedelta(hours=1)).delete()
    TraceConversation.objects.filter(project=project, started_at__lt=span_cutoff).delete()  # with their spans
    ConversationMinute.objects.filter(  # the tool rows they counted are gone: the next totals' pass sums the rest
        conversation__project=project, minute__lt=record_cutoff - timedelta(minutes=1)).delete()
    UsageHourlyRollup.objects.filter(project=project, hour__lt=record_cutoff - timedelta(hours=1)).delete()  # [costs]
    # OTLP metrics' hours live as long as the records; a series not heard of for as long is
    # forgotten (its next cumulative point then counts whole: a process that long silent restarted)
    MetricHour.objects.filter(project=project, hour__lt=record_cutoff - timedelta(hours=1)).delete()
    MetricSeries.objects.filter(project=project, seen_at__lt=record_cutoff).delete()
    _, deleted_by_model = Conversation.objects.filter(
        project=project, last_activity_at__lt=record_cutoff
    ).delete()
    outcome.conversations = deleted_by_model.get(Conversation._meta.label, 0)

    expired = Artifact.objects.filter(project=project).filter(
        models.Q(expires_at__lt=now) | models.Q(created_at__lt=now - timedelta(days=artifact_days))
    )
    for artifact in expired.iterator():
        name = artifact.file.name
        artifact.delete()
        if name:
            artifact.file.storage.delete(name)
        outcome.artifacts += 1
    return outcome
