"""Writes for the stored conversation data: records, artifacts, retention.

``records_store`` is the ingest fast path: a fixed number of queries per batch
whatever its size (get-or-create the conversations in bulk, then one bulk insert
per record type that skips record ids already stored), all in the caller's
transaction. Everything derived is left to the tasks, enqueued after commit by
``derivations_enqueue``.
"""

from __future__ import annotations

import hashlib
import json
import operator
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import IO, Any, Iterable, Sequence

from django.conf import settings
from django.core.files.base import File
from django.db import IntegrityError, connections, models, router, transaction
from django.utils import timezone

from dashboard.accounts.models import Project
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
    hour_of,
    minute_of,
)
from .partitions import span_retention_cutoff


@dataclass
class StoreOutcome:
    accepted: int = 0
    duplicates: int = 0
    conversation_ids: set[int] = field(default_factory=set)
    tool_minutes: set[datetime] = field(default_factory=set)  # of the tool results stored


# --- records ----------------------------------------------------------------------

def conversations_get_or_create(
    *, project: Project, first_seen: dict[str, tuple[datetime, datetime]]
) -> dict[str, int]:
    """Conversation pk by external id, creating the missing ones in bulk.

    ``first_seen`` maps external id -> (earliest, latest) time seen in this batch,
    used as started_at / last_activity_at of a new conversation. Two to three
    queries whatever the number of conversations; a concurrent creator is absorbed
    by ignore_conflicts and the re-read.
    """
    ids = list(first_seen)
    found = dict(
        Conversation.objects.filter(project=project, external_id__in=ids).values_list("external_id", "pk")
    )
    missing = [external_id for external_id in ids if external_id not in found]
    if missing:
        Conversation.objects.bulk_create(
            [
                Conversation(
                    project=project,
                    external_id=external_id,
                    started_at=first_seen[external_id][0],
                    last_activity_at=first_seen[external_id][1],
                )
                for external_id in missing
            ],
            ignore_conflicts=True,
        )
        found.update(
            Conversation.objects.filter(project=project, external_id__in=missing).values_list("external_id", "pk")
        )
    return found


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


# --- bulk insert --------------------------------------------------------------------

# One encoder for the module (json.dumps with options builds one per call); compact
# and UTF-8 as is: the stored text is only ever read back as JSON.
json_text = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

_PLAIN_TYPES = {
    "AutoField", "BigAutoField", "BigIntegerField", "BooleanField", "CharField", "FloatField", "ForeignKey",
    "IntegerField", "PositiveIntegerField", "PositiveSmallIntegerField", "SmallIntegerField", "TextField",
}


def sqlite_datetime(value: datetime | None) -> str | None:
    """What Django's SQLite backend stores for a datetime: naive UTC as text."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(dt_timezone.utc).replace(tzinfo=None)
    return str(value)


def _uuid_hex(value: uuid.UUID | None) -> str | None:
    return None if value is None else value.hex


def _adapter(field: models.Field, connection: Any) -> Any:
    """How a Python value of this column becomes what the driver takes: None when
    as it is, else a plain function (Django's ``get_db_prep_save`` does the same
    but costs more than the database on this path)."""
    kind = field.get_internal_type()
    if kind in _PLAIN_TYPES:
        return None
    if kind == "JSONField" and field.encoder is None:
        return json_text
    if connection.vendor == "sqlite" and kind == "DateTimeField":
        return sqlite_datetime
    if connection.vendor == "sqlite" and kind == "UUIDField":
        return _uuid_hex
    if connection.vendor == "postgresql" and kind in ("DateTimeField", "UUIDField"):
        return None  # psycopg adapts aware datetimes and UUIDs natively
    return lambda value: field.get_db_prep_save(value, connection)


def read_together(queries: Sequence[tuple[str, Sequence[Any]]], using: str = "default") -> list[list[tuple[Any, ...]]]:
    """The rows of each query (sql, params), in order. On PostgreSQL they go as one
    query string (the simple protocol: Django's psycopg cursor binds parameters
    client-side), one round trip for all; SQLite runs one statement at a time, each
    a local read."""
    if not queries:
        return []
    connection = connections[using]
    together = (connection.vendor == "postgresql" and len(queries) > 1
                and not connection.settings_dict["OPTIONS"].get("server_side_binding"))
    with connection.cursor() as cursor:
        if not together:  # (server-side binding prepares each statement: one at a time)
            results = []
            for sql, params in queries:
                cursor.execute(sql, params)
                results.append(cursor.fetchall())
            return results
        cursor.execute("; ".join(sql for sql, _ in queries), [value for _, params in queries for value in params])
        results = [cursor.fetchall()]
        while cursor.nextset():
            results.append(cursor.fetchall())
        return results


def insert_ignoring_conflicts(model: type[models.Model], rows: Sequence[dict[str, Any]]) -> int:
    """Insert rows given as {attname: Python value} (columns left out take their
    default), skipping those that hit a unique constraint; returns how many were
    inserted. A conflict is a retry of the same record_id, so skipping it is right."""
    if not rows:
        return 0
    connection = connections[router.db_for_write(model)]
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    defaults = {f.attname: f.get_default() for f in fields}
    pick = operator.itemgetter(*defaults)  # the row's values in column order, at C speed
    adapted = [(i, adapt) for i, f in enumerate(fields) if (adapt := _adapter(f, connection)) is not None]
    values = []
    for row in rows:
        row_values = list(pick({**defaults, **row}))
        for i, adapt in adapted:
            if row_values[i] is not None:
                row_values[i] = adapt(row_values[i])
        values.append(row_values)
    return insert_values_ignoring_conflicts(model, [f.column for f in fields], values)


def insert_values_ignoring_conflicts(
    model: type[models.Model], columns: Sequence[str], values: Sequence[Sequence[Any]], *, optimistic: bool = False
) -> int:
    """INSERT … ON CONFLICT DO NOTHING of rows already adapted to the driver, in
    the caller's transaction; returns the rows inserted.

    - SQLite: one prepared statement run with ``executemany``;
    - PostgreSQL: ``COPY`` straight into the table, in a savepoint. COPY cannot
      skip conflicts, but a conflict is rare (a retried batch), and psycopg
      formats COPY rows far cheaper than statement parameters; the database
      writes each row once. When the COPY hits a unique constraint the savepoint
      undoes it and the rows go through ``_copy_via_staging``, which skips them.
      ``optimistic``: no savepoint (two round trips and a subtransaction fewer), for
      a caller that can run its transaction again: a conflict raises IntegrityError
      and leaves the transaction to roll back (the group commit's first try).

    What ``bulk_create(ignore_conflicts=True)`` does, without its per-row model
    instances and SQL compilation, and without SQLite's 999-parameter batches.
    """
    if not values:
        return 0
    alias = router.db_for_write(model)
    connection = connections[alias]
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    column_list = ", ".join(quote(column) for column in columns)
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            placeholders = ", ".join(["%s"] * len(columns))
            cursor.executemany(
                f"INSERT INTO {table} ({column_list}) VALUES ({placeholders}) ON CONFLICT DO NOTHING", values
            )
            return max(cursor.rowcount, 0)
        if optimistic:
            _copy(cursor, table, column_list, values)
            return len(values)
        try:
            with transaction.atomic(using=alias):
                _copy(cursor, table, column_list, values)
            return len(values)
        except IntegrityError:
            return _copy_via_staging(cursor, model, table, column_list, values)


def _copy(cursor: Any, table: str, column_list: str, values: Sequence[Sequence[Any]]) -> None:
    # psycopg's own cursor (Django's wrapper has no copy); its errors become
    # Django's, so a deadlock is an OperationalError (503) and a conflict an IntegrityError.
    with cursor.db.wrap_database_errors:
        with cursor.cursor.copy(f"COPY {table} ({column_list}) FROM STDIN") as copy:
            for row in values:
                copy.write_row(row)


def _copy_via_staging(cursor: Any, model: type[models.Model], table: str, column_list: str,
                      values: Sequence[Sequence[Any]]) -> int:
    """COPY into a temp staging table, then one INSERT … SELECT … ON CONFLICT DO
    NOTHING. The staging table belongs to this connection and empties itself at
    commit or rollback; rows an earlier call of the same transaction left are
    deleted first."""
    staging = cursor.db.ops.quote_name(f"{model._meta.db_table}_ingest")
    cursor.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {staging} ON COMMIT DELETE ROWS "
        f"AS SELECT {column_list} FROM {table} WITH NO DATA"
    )
    cursor.execute(f"DELETE FROM {staging}")
    _copy(cursor, staging, column_list, values)
    cursor.execute(f"INSERT INTO {table} ({column_list}) SELECT {column_list} FROM {staging} ON CONFLICT DO NOTHING")
    return max(cursor.rowcount, 0)


def derivations_enqueue(
    *,
    project_id: int,
    conversation_ids: Iterable[int] = (),
    hours: Iterable[datetime] = (),
    artifact_ids: Iterable[str] = (),
    trace_ids: Iterable[str] = (),
    rows_from: datetime | None = None,
    minutes: Iterable[datetime] = (),
) -> None:
    """Record the derivations a write needs: conversation totals, tool rollups
    of the minutes its tool rows fall in (or of whole hours), links between spans, records and artifacts, traces whose spans to link. Records, OTLP spans and
    artifact uploads all come here, inside the transaction that stores their rows:
    the note (observatory.outbox) commits with them or not at all, so a crash never
    loses derivations of acknowledged rows. After the commit the drainer is told.
    ``rows_from``: a time taken before the rows were stamped received (their
    derivation then reads the rows received from it, nothing earlier)."""
    from .dispatch import notify
    from .outbox import note_write

    conversation_list = sorted(set(conversation_ids))
    hour_list = sorted({hour_of(hour).isoformat() for hour in hours})
    minute_list = sorted({minute_of(minute).isoformat() for minute in minutes})
    artifact_list = sorted(set(artifact_ids))
    trace_list = sorted(set(trace_ids))
    if not conversation_list and not hour_list and not minute_list and not artifact_list and not trace_list:
        return
    note_write(project_id=project_id, conversation_ids=conversation_list, hours=hour_list, minutes=minute_list,
               artifact_ids=artifact_list, trace_ids=trace_list, rows_from=rows_from)
    # robust: the batch and its note are committed; a failing notification (broker
    # down, an eager task error) is logged and the note drained by the next poll.
    transaction.on_commit(notify, robust=True)


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
