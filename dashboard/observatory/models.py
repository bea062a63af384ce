"""What agents sent and what the tasks derive from it.

The record-born rows (Round, Message, ToolExecution, CompressionEvent,
SkillActivation) hold every field of the pipeline's records (``pipeline._records``
is the schema) and a unique ``record_id``: a retried batch inserts nothing twice.
Spans come from OTLP (``dashboard.ingest.spans`` fills them); (project, trace_id,
span_id) is unique for the same reason. Conversation totals and ToolHourlyRollup
are derived by tasks and can be recomputed from the rows at any time.

Every index below serves a query a page makes; the comment says which.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from datetime import timezone as dt_timezone

from django.core.files.storage import storages
from django.core.signals import setting_changed
from django.db import models
from django.db.models import Q
from django.dispatch import receiver
from django.utils import timezone
from django.utils.functional import LazyObject, empty

from dashboard.accounts.models import Project

from .conventions import EXECUTE_TOOL
from .histogram import empty_histogram

ID_LENGTH = 200  # pipeline Identifier max_length
TOOL_CALL_ID_LENGTH = 256  # ToolExecutionResult.tool_call_id max_length


class Conversation(models.Model):
    class Status(models.TextChoices):
        OK = "ok", "OK"
        ERROR = "error", "Error"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="conversations")
    external_id = models.CharField(max_length=ID_LENGTH)  # the agent's conversation_id
    title = models.CharField(max_length=200, blank=True)  # from the first user message
    user_id = models.CharField(max_length=ID_LENGTH, blank=True)
    model = models.CharField(max_length=ID_LENGTH, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OK)
    started_at = models.DateTimeField(default=timezone.now)
    last_activity_at = models.DateTimeField(default=timezone.now)

    # Totals, maintained by the conversation_totals task (recomputed from rows).
    rounds = models.PositiveIntegerField(default=0)
    messages = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    max_context_tokens = models.BigIntegerField(default=0)
    compressions = models.PositiveIntegerField(default=0)
    has_errors = models.BooleanField(default=False)
    totals_updated_at = models.DateTimeField(null=True, blank=True)
    # Cost (observatory.costs): the sum of the priced rounds' costs in pico-USD
    # (1e-12 USD: exact integers for any price with six decimals), null when no
    # round has a price; unpriced_rounds counts the rounds whose model has none.
    cost_pico_usd = models.BigIntegerField(null=True, blank=True)
    unpriced_rounds = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "external_id"], name="conversation_external_id_unique"),
        ]
        indexes = [
            # conversation list, newest activity first / newest started first
            models.Index(fields=["project", "-last_activity_at"], name="conv_project_activity"),
            models.Index(fields=["project", "-started_at"], name="conv_project_started"),
            # overview totals over a range: answered from this index alone (covering)
            models.Index(
                fields=["project", "started_at", "has_errors", "input_tokens", "output_tokens"],
                name="conv_project_started_totals",
            ),
            # list filters
            models.Index(fields=["project", "status", "-last_activity_at"], name="conv_project_status"),
            models.Index(fields=["project", "model", "-last_activity_at"], name="conv_project_model"),
            models.Index(fields=["project", "user_id", "-last_activity_at"], name="conv_project_user"),
            models.Index(fields=["project", "has_errors", "-last_activity_at"], name="conv_project_errors"),
        ]

    def __str__(self) -> str:
        return self.title or self.external_id


class _RecordRow(models.Model):
    """Fields every record-born row has. ``record_id`` is unique per project: the
    retry of a batch inserts nothing twice, and one project cannot block another's
    records by sending their ids."""

    record_id = models.UUIDField()
    schema_version = models.PositiveSmallIntegerField(default=1)
    # No index of their own: every insert pays for each index, and both columns
    # lead a composite index already ((project, record_id) below; (conversation, …)
    # in each subclass), which serves the same lookups and cascades.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+", db_index=False)
    occurred_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True
        constraints = [
            models.UniqueConstraint(fields=["project", "record_id"], name="%(class)s_record_unique"),
        ]


class Source(models.TextChoices):
    """Where a round, message or tool execution came from: a pipeline record, or
    derived from spans (observatory.derive.passes.span_rows) when no record describes the call."""

    RECORD = "record", "record"
    SPAN = "span", "span"


class Round(_RecordRow):
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="round_set", db_index=False
    )
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.RECORD)
    span_id = models.CharField(max_length=16, blank=True)  # the model call's span (derived rounds)
    round_id = models.CharField(max_length=ID_LENGTH)
    index = models.PositiveIntegerField()
    trace_id = models.CharField(max_length=32, blank=True)
    model = models.CharField(max_length=ID_LENGTH, blank=True)
    user_id = models.CharField(max_length=ID_LENGTH, blank=True)
    user_message = models.TextField(blank=True)
    thoughts = models.JSONField(default=list)
    final_answer = models.TextField(null=True, blank=True)
    status = models.CharField(max_length=8, default="ok")
    context_tokens = models.BigIntegerField(default=0)  # as the agent reported it
    context_window = models.BigIntegerField(null=True, blank=True)
    compression_threshold = models.FloatField(null=True, blank=True)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    # Derived by the conversation_totals task: the context size per round for the
    # token-budget chart (the reported value, or the running sum of message tokens
    # when the agent did not report one), and what happened in the round.
    derived_context_tokens = models.BigIntegerField(default=0)
    tool_call_count = models.PositiveIntegerField(default=0)
    error_count = models.PositiveIntegerField(default=0)
    # input and output tokens at the price in force that day (observatory.costs);
    # null when the model has no price.
    cost_pico_usd = models.BigIntegerField(null=True, blank=True)

    class Meta(_RecordRow.Meta):
        indexes = [
            models.Index(fields=["conversation", "index"], name="round_conversation_index"),
            models.Index(fields=["project", "trace_id"], name="round_project_trace"),  # span linking
            # the rounds a batch brought (derive.passes.totals: _scoped_rounds, span_rows:
            # _records_win); by round_conversation_index those read every round of the
            # batch's conversations, so a long conversation cost its history
            models.Index(fields=["conversation", "received_at"], name="round_conversation_received"),
        ]


class Message(_RecordRow):
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="message_set", db_index=False
    )
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.RECORD)
    round_id = models.CharField(max_length=ID_LENGTH, blank=True)
    index = models.PositiveIntegerField()
    role = models.CharField(max_length=16)
    content = models.TextField(blank=True)
    name = models.CharField(max_length=200, blank=True)
    tool_calls = models.JSONField(default=list)
    tool_call_id = models.CharField(max_length=ID_LENGTH, blank=True)
    is_meta = models.BooleanField(default=False)
    tokens = models.PositiveIntegerField(null=True, blank=True)

    class Meta(_RecordRow.Meta):
        indexes = [models.Index(fields=["conversation", "index"], name="message_conversation_index")]


# A tool span outside any conversation that failed (status ERROR or an error type).
SPAN_TOOL_FAILURE = (
    ~Q(tool_name="") & Q(conversation__isnull=True) & (Q(status_code=2) | Q(attributes__has_key="error.type"))
)


# A tool span that no span-row pass turns into a tool execution: outside any
# conversation, or not a tool call's span (span_rows derives the execute_tool spans of
# conversations). Only these can be span-only calls in a minute's tool rollups.
SPAN_TOOL_UNDERIVED = ~Q(tool_name="") & (Q(conversation__isnull=True) | ~Q(operation=EXECUTE_TOOL))


class Span(models.Model):
    """One OpenTelemetry span. Filled by the OTLP ingest (dashboard.ingest.spans).

    ``conversation_key`` (gen_ai.conversation.id, else session.id) and ``tool_name``
    (gen_ai.tool.name) are copied out of the attributes at ingest so linking and
    span-only tool statistics are indexed queries; ``conversation`` is set by the
    link task (or at ingest when the conversation is already known).

    Spans are the most written table, so it has few indexes and the sparse ones
    are partial: most spans have no tool call, no tool name and no conversation,
    and a partial index costs an insert nothing when its condition is false. A
    query can use a partial index only when its WHERE implies the condition, so
    the queries that need one say so (``.exclude(tool_call_id="")`` etc.).

    On PostgreSQL the table is partitioned by day on ``start_time`` (migration 0008,
    observatory.partitions): there the primary key is (id, start_time) and span_unique
    holds start_time too, as a partitioned table's unique keys must; Django keeps
    ``id`` (one sequence) as the pk.
    """

    # project leads the unique constraint and span_project_time: no index of its own. No
    # database constraint on PostgreSQL (checked for every span stored: migration 0018).
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="spans", db_index=False,
                                db_constraint=False)
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=255, blank=True)
    kind = models.SmallIntegerField(default=0)  # OTLP SpanKind enum value
    start_time = models.DateTimeField()
    end_time = models.DateTimeField()
    duration_ms = models.FloatField(default=0.0)
    status_code = models.SmallIntegerField(default=0)  # 0 unset, 1 ok, 2 error
    status_message = models.TextField(blank=True)
    service_name = models.CharField(max_length=200, blank=True)
    attributes = models.JSONField(default=dict)
    events = models.JSONField(default=list)
    links = models.JSONField(default=list)  # OTLP span links: [{trace_id, span_id, attributes}]
    resource = models.JSONField(default=dict)
    # Indexed by the partial span_conversation_time only (most spans have none).
    conversation = models.ForeignKey(
        Conversation, on_delete=models.SET_NULL, null=True, blank=True, related_name="spans", db_index=False
    )
    conversation_key = models.CharField(max_length=ID_LENGTH, blank=True)
    tool_name = models.CharField(max_length=ID_LENGTH, blank=True)
    tool_call_id = models.CharField(max_length=TOOL_CALL_ID_LENGTH, blank=True)
    # chat / execute_tool / invoke_agent / embeddings / retrieval, read through
    # observatory.conventions at ingest; "" for spans no convention describes.
    operation = models.CharField(max_length=16, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    # Ingest cut its attributes, events or name to the stored limits.
    truncated = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "trace_id", "span_id"], name="span_unique"),
        ]
        indexes = [
            # the trace view / waterfall is served by the unique constraint (project, trace_id, …);
            # retention purge and recent spans of a project
            models.Index(fields=["project", "-start_time"], name="span_project_time"),
            # conversation timeline, totals, and SET_NULL when a conversation goes
            models.Index(
                fields=["conversation", "start_time"], name="span_conversation_time",
                condition=Q(conversation__isnull=False),
            ),
            # a conversation's last activity: its spans' latest end, one index lookup
            models.Index(
                fields=["conversation", "end_time"], name="span_conversation_end",
                condition=Q(conversation__isnull=False),
            ),
            # linking tool executions to spans by tool call id
            models.Index(
                fields=["project", "tool_call_id"], name="span_project_tool_call",
                condition=~Q(tool_call_id=""),
            ),
            # the trace list: root spans of a project, newest first (one row per trace)
            models.Index(
                fields=["project", "-start_time", "-id"], name="span_project_roots",
                condition=Q(parent_span_id=""),
            ),
            # span-only tool statistics by hour (rollups, hours_with_rows)
            models.Index(
                fields=["project", "start_time"], name="span_tool_time",
                condition=~Q(tool_name=""),
            ),
            # span-only calls of a minute's tool rollups: the tool spans no tool execution
            # is derived from (most tool spans of conversations are: this skips them)
            models.Index(
                fields=["project", "start_time"], name="span_tool_underived",
                condition=SPAN_TOOL_UNDERIVED,
            ),
            # the span-row pass after a batch: a conversation's model-call and tool spans
            # received since its notes, never the conversation's history (spans with
            # no operation, most of them, cost this index nothing)
            models.Index(
                fields=["conversation", "received_at"], name="span_derivable_received",
                condition=~Q(operation=""),
            ),
            # the trace list's "has errors" test, per root: the trace's failed spans
            # (rare rows) without reading each of its spans from the table
            models.Index(
                fields=["project", "trace_id", "start_time"], name="span_trace_errors",
                condition=Q(status_code=2),
            ),
            # a tool's failed span-only calls (selectors.recent_span_failures): rare rows,
            # found newest first without walking the tool spans that succeeded
            models.Index(
                fields=["project", "tool_name", "-start_time"], name="span_tool_failures",
                condition=SPAN_TOOL_FAILURE,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.trace_id}/{self.span_id}"


class LogRecord(models.Model):
    """One OpenTelemetry log record (OTLP logs: ``dashboard.ingest.logs`` fills it).

    GenAI instrumentations send prompts and completions as log records/events tied
    to a span. A record names its span by (trace_id, span_id), both "" when it has
    none; there is no foreign key to Span on purpose (the span table is partitioned
    on PostgreSQL and a log may arrive before its span). ``conversation`` comes from
    the log's own conversation attribute, else from its span's (at ingest, or by
    the link derivation when the span arrives later). ``record_hash`` (of the
    record's content) makes a retried batch store no duplicate.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="log_records", db_index=False)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)
    record_hash = models.CharField(max_length=32)
    time = models.DateTimeField(null=True, blank=True)  # when it happened (null: the sender did not say)
    observed_time = models.DateTimeField(null=True, blank=True)
    severity_number = models.SmallIntegerField(default=0)  # OTLP SeverityNumber, 0..24
    severity_text = models.CharField(max_length=32, blank=True)
    event_name = models.CharField(max_length=ID_LENGTH, blank=True)
    body = models.JSONField(null=True, blank=True)  # the AnyValue as JSON
    attributes = models.JSONField(default=dict)
    resource = models.JSONField(default=dict)
    service_name = models.CharField(max_length=200, blank=True)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.SET_NULL, null=True, blank=True, related_name="log_records", db_index=False
    )
    conversation_key = models.CharField(max_length=ID_LENGTH, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    truncated = models.BooleanField(default=False)

    class Meta:
        constraints = [
            # retries; also serves the trace page (project, trace_id, ...)
            models.UniqueConstraint(fields=["project", "trace_id", "span_id", "record_hash"], name="logrecord_unique"),
        ]
        indexes = [
            # the logs list (keyset by id, newest first)
            models.Index(fields=["project", "-id"], name="logrecord_project_id"),
            # retention purge
            models.Index(fields=["project", "received_at"], name="logrecord_project_received"),
            # the conversation timeline, and SET_NULL when a conversation goes
            models.Index(
                fields=["conversation", "time"], name="logrecord_conversation_time",
                condition=Q(conversation__isnull=False),
            ),
            # the link derivation: records still waiting for their span's conversation
            models.Index(
                fields=["project", "trace_id"], name="logrecord_unlinked",
                condition=Q(conversation__isnull=True) & ~Q(trace_id=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_name or self.severity_text or 'log'} {self.trace_id}/{self.span_id}"


class ToolExecution(_RecordRow):
    """One tool_result record: the request side, the ToolExecutionResult, and the
    same result rendered at BRIEF, STANDARD and FULL with their token counts."""

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="tool_executions", db_index=False
    )
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.RECORD)
    round_id = models.CharField(max_length=ID_LENGTH, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)
    # The span of this call, set by the link task (by span_id, else by tool_call_id).
    # Indexed by the partial toolexec_linked_span (null on insert, so free then).
    # No database constraint: on PostgreSQL spans are partitioned by day and ``id``
    # alone is not a unique key there. A row delete clears it (Django's SET_NULL); a
    # dropped day leaves the id of a span that is gone (observatory.partitions says why).
    linked_span = models.ForeignKey(
        Span, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False,
        db_constraint=False,
    )
    tool_name = models.CharField(max_length=ID_LENGTH)
    tool_version = models.CharField(max_length=64, default="1.0.0")
    parameters = models.JSONField(default=dict)
    model = models.CharField(max_length=ID_LENGTH, blank=True)

    # ToolExecutionResult
    tool_call_id = models.CharField(max_length=TOOL_CALL_ID_LENGTH)
    observation = models.TextField(blank=True)
    output_level = models.CharField(max_length=16)
    artifact_id = models.CharField(max_length=80, blank=True)
    data_size_bytes = models.BigIntegerField(default=0)
    data_hash = models.CharField(max_length=200, blank=True)
    data_summary = models.TextField(blank=True)
    retry_count = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    success = models.BooleanField()
    error_code = models.CharField(max_length=200, blank=True)
    error_type = models.CharField(max_length=200, blank=True)
    error_message = models.TextField(blank=True)
    duration_ms = models.FloatField(default=0.0)
    # Null: unknown (a call known only from its span, whose span carries no whole
    # result): left out of every sum and counted as left out, never taken for 0.
    observation_tokens = models.PositiveIntegerField(default=0, null=True, blank=True)
    cache_hit = models.BooleanField(default=False)

    # The three renderings (null when the agent did not send that level).
    brief_observation = models.TextField(null=True, blank=True)
    brief_tokens = models.PositiveIntegerField(null=True, blank=True)
    standard_observation = models.TextField(null=True, blank=True)
    standard_tokens = models.PositiveIntegerField(null=True, blank=True)
    full_observation = models.TextField(null=True, blank=True)
    full_tokens = models.PositiveIntegerField(null=True, blank=True)

    class Meta(_RecordRow.Meta):
        indexes = [
            # tool detail: executions of one tool over time; rollups by hour
            models.Index(fields=["project", "tool_name", "-occurred_at"], name="toolexec_project_tool_time"),
            # conversation timeline
            models.Index(fields=["conversation", "occurred_at"], name="toolexec_conversation_time"),
            # a round's tool calls, counted again when a batch brings some (derive.passes.totals);
            # partial: a call of no round (an agent sending only tool spans) costs it nothing
            models.Index(fields=["conversation", "round_id"], name="toolexec_conversation_round",
                         condition=~Q(round_id="")),
            # recent failures
            models.Index(
                fields=["project", "-occurred_at"], name="toolexec_project_failures",
                condition=Q(success=False),
            ),
            # rollups recompute hours touched by new rows
            models.Index(fields=["project", "occurred_at"], name="toolexec_project_time"),
            # linking to spans
            models.Index(fields=["project", "tool_call_id"], name="toolexec_project_tool_call"),
            # the link pass after a batch reads the rows received since its note
            models.Index(fields=["project", "received_at"], name="toolexec_project_received"),
            # SET_NULL when a span is purged
            models.Index(
                fields=["linked_span"], name="toolexec_linked_span", condition=Q(linked_span__isnull=False)
            ),
            # linking artifacts (most executions name none)
            models.Index(
                fields=["project", "artifact_id"], name="toolexec_project_artifact",
                condition=~Q(artifact_id=""),
            ),
        ]


class CompressionEvent(_RecordRow):
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="compression_events", db_index=False
    )
    round_id = models.CharField(max_length=ID_LENGTH, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)
    result = models.JSONField()  # the whole CompressionResult, for the diff page
    mode = models.CharField(max_length=16)
    requested_mode = models.CharField(max_length=16, blank=True)
    model = models.CharField(max_length=ID_LENGTH, blank=True)
    target_tokens = models.BigIntegerField(default=0)
    tokens_before = models.BigIntegerField(default=0)
    tokens_after = models.BigIntegerField(default=0)
    messages_before = models.PositiveIntegerField(default=0)
    messages_after = models.PositiveIntegerField(default=0)
    kept_count = models.PositiveIntegerField(default=0)
    dropped_count = models.PositiveIntegerField(default=0)
    truncated_count = models.PositiveIntegerField(default=0)
    summarized_count = models.PositiveIntegerField(default=0)
    target_met = models.BooleanField(default=True)
    duration_ms = models.FloatField(default=0.0)

    class Meta(_RecordRow.Meta):
        indexes = [
            models.Index(fields=["conversation", "occurred_at"], name="compression_conversation_time"),
            models.Index(fields=["project", "-occurred_at"], name="compression_project_time"),
        ]


class SkillActivation(_RecordRow):
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="skill_activations", db_index=False
    )
    round_id = models.CharField(max_length=ID_LENGTH, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)
    skill_name = models.CharField(max_length=ID_LENGTH)
    activation_id = models.CharField(max_length=ID_LENGTH)
    load_level = models.PositiveSmallIntegerField()
    depth = models.PositiveIntegerField(default=0)
    chain = models.JSONField(default=list)
    tokens_loaded = models.PositiveIntegerField(default=0)
    resources = models.JSONField(default=list)
    success = models.BooleanField(default=True)
    error = models.TextField(null=True, blank=True)
    duration_ms = models.FloatField(default=0.0)

    class Meta(_RecordRow.Meta):
        indexes = [
            models.Index(fields=["conversation", "occurred_at"], name="skill_conversation_time"),
            models.Index(fields=["project", "skill_name", "-occurred_at"], name="skill_project_name_time"),
        ]


class _ArtifactStorage(LazyObject):
    """The "artifacts" storage, looked up when first used and again after a test
    overrides STORAGES (the FileField keeps this proxy, not a fixed backend)."""

    def _setup(self) -> None:
        self._wrapped = storages["artifacts"]


artifact_storage = _ArtifactStorage()


@receiver(setting_changed)
def _storages_changed(*, setting: str, **kwargs: object) -> None:
    if setting == "STORAGES":
        artifact_storage._wrapped = empty


def _artifact_storage() -> _ArtifactStorage:
    return artifact_storage


def artifact_file_name(project_id: int) -> str:
    """A generated storage name: never the client's, never derived from the artifact id."""
    return f"p{project_id}/{timezone.now():%Y/%m}/{uuid.uuid4().hex}"


def _artifact_upload_to(instance: "Artifact", filename: str) -> str:
    return artifact_file_name(instance.project_id)


class Artifact(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="artifacts")
    artifact_id = models.CharField(max_length=80)
    file = models.FileField(storage=_artifact_storage, upload_to=_artifact_upload_to, max_length=200)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    content_type = models.CharField(max_length=200, default="application/octet-stream")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    # Set by the link task when a tool_result record names this artifact.
    tool_execution = models.ForeignKey(
        ToolExecution, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    conversation = models.ForeignKey(
        Conversation, on_delete=models.SET_NULL, null=True, blank=True, related_name="artifacts"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "artifact_id"], name="artifact_id_unique"),
        ]
        indexes = [
            models.Index(fields=["project", "-created_at"], name="artifact_project_created"),
            models.Index(fields=["conversation", "created_at"], name="artifact_conversation"),
            models.Index(fields=["expires_at"], name="artifact_expires"),
        ]

    def __str__(self) -> str:
        return self.artifact_id


def hour_of(moment: datetime) -> datetime:
    """The start of ``moment``'s hour, UTC: a ToolHourlyRollup's ``hour``."""
    return moment.astimezone(dt_timezone.utc).replace(minute=0, second=0, microsecond=0)


def minute_of(moment: datetime) -> datetime:
    """The start of ``moment``'s minute, UTC: a ToolMinuteRollup's ``minute``."""
    return moment.astimezone(dt_timezone.utc).replace(second=0, microsecond=0)


class ToolRollupFigures(models.Model):
    """One tool's figures over a span of time: what the hourly rollups and their
    minute slices both hold."""

    tool_name = models.CharField(max_length=ID_LENGTH)
    calls = models.PositiveIntegerField(default=0)
    successes = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    timeouts = models.PositiveIntegerField(default=0)
    cache_hits = models.PositiveIntegerField(default=0)
    duration_sum_ms = models.FloatField(default=0.0)
    # Bucket counts over histogram.LATENCY_BUCKET_BOUNDS_MS (+1 overflow bucket).
    latency_histogram = models.JSONField(default=empty_histogram)
    brief_tokens = models.BigIntegerField(default=0)
    brief_count = models.PositiveIntegerField(default=0)
    standard_tokens = models.BigIntegerField(default=0)
    standard_count = models.PositiveIntegerField(default=0)
    full_tokens = models.BigIntegerField(default=0)
    full_count = models.PositiveIntegerField(default=0)
    error_types = models.JSONField(default=dict)  # {"timeout": 3, ...}
    # Observation tokens at the input price of the call's model (observatory.costs);
    # priced_calls says how many calls had a price (span-only calls never do).
    cost_pico_usd = models.BigIntegerField(default=0)
    priced_calls = models.PositiveIntegerField(default=0)
    # Calls whose observation tokens are unknown (ToolExecution.observation_tokens null,
    # a span-only call without ba.observation_tokens): in no token sum, no level's count
    # and no cost; the pages say how many were left out.
    unknown_token_calls = models.PositiveIntegerField(default=0)
    # Observation tokens of the calls with no output level (known only from a span
    # of another convention): what the model saw, counted in no level.
    unleveled_tokens = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class ToolHourlyRollup(ToolRollupFigures):
    """One tool's calls in one hour: the sum of the hour's minute slices
    (ToolMinuteRollup), rewritten whenever one of them is. What the pages read.

    Counts come from tool executions plus tool spans that no record describes, so a
    tool traced only through OpenTelemetry still has statistics.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tool_rollups")
    hour = models.DateTimeField()  # start of the hour, UTC

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "tool_name", "hour"], name="rollup_unique"),
        ]
        indexes = [
            # tools table over a time range; tool detail charts
            models.Index(fields=["project", "hour"], name="rollup_project_hour"),
        ]


class ToolMinuteRollup(ToolRollupFigures):
    """One tool's calls in one minute, recomputed whole from the rows (idempotent).

    A batch's rows fall in the minutes around now, so recomputing its minutes reads
    seconds of rows, where recomputing its hour read up to an hour of them (the
    recompute then grew through the hour until it was most of the derivation's
    time). ``updated_at`` is when the pass that wrote the slice began reading; each
    recompute also writes the minute's mark (tool name "", derive.passes.rollups.MINUTE_MARK),
    so that holds even for a minute it found empty.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tool_minute_rollups",
                                db_index=False)  # the unique key's index begins with it
    minute = models.DateTimeField()  # start of the minute, UTC

    class Meta:
        constraints = [
            # also the index of an hour's slices (project, minute range)
            models.UniqueConstraint(fields=["project", "minute", "tool_name"], name="minute_rollup_unique"),
        ]


class ConversationMinute(models.Model):
    """A conversation's tool calls in one minute (by ``occurred_at``), recomputed
    whole from the minute's rows; the conversation's tool-call, error and retry
    totals are the sums of its slices, written in the same transaction.

    A batch's tool rows fall in the minutes around now, so a pass after it reads
    seconds of rows per conversation where recounting the conversation read all of
    them (the never-ending conversations of the hour-long soak gained ~40,000 tool
    calls an hour each, and the derivations kept up with less and less ingest).
    ``updated_at`` is when the pass that wrote the slice began reading: a pass
    begun earlier never writes over it. A slice whose rows are gone is written
    with zeros, not deleted, so that holds for it too.
    """

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="minutes",
                                     db_index=False)  # the unique key's index begins with it
    minute = models.DateTimeField()  # start of the minute, UTC (minute_of)
    tool_calls = models.PositiveIntegerField(default=0)
    tool_errors = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    tool_model = models.CharField(max_length=ID_LENGTH, blank=True)  # of the minute's last call naming one
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["conversation", "minute"], name="conversation_minute_unique"),
        ]


class TraceConversation(models.Model):
    """The conversation of a trace, recorded when one of its spans is linked to one
    (at ingest, by the link derivations). Ingest looks a batch's unnamed traces up
    here, one probe of the unique key per trace, where it read the spans table: on
    PostgreSQL that query was planned over every day partition, about 1 ms of the
    database's CPU for every small batch of plain spans (more than storing it).
    The first conversation recorded for a trace stays (as the first span found did).
    ``started_at`` is the start of the trace's earliest span seen when recorded:
    retention removes the row with the trace's spans."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, db_index=False)  # the unique key's index
    trace_id = models.CharField(max_length=32)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+")
    started_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "trace_id"], name="trace_conversation_unique"),
        ]
        # For retention. Not (project, started_at): ingest's lookup, by project and
        # trace ids, could take that one on a table without statistics yet.
        indexes = [models.Index(fields=["started_at"], name="trace_conversation_started")]


class UsageHourlyRollup(models.Model):
    """The conversations started in one hour, per model: how many, their tokens
    and cost, recomputed whole from the conversation rows (observatory.costs) when
    their totals are. The overview's series and cost read these, a few rows per
    hour, instead of every conversation of the range; a bucket's figures are those
    of the conversation list filtered to its hour."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="usage_rollups")
    hour = models.DateTimeField()  # start of the hour, UTC
    model = models.CharField(max_length=ID_LENGTH, blank=True)
    conversations = models.PositiveIntegerField(default=0)
    conversations_with_errors = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cost_pico_usd = models.BigIntegerField(default=0)
    priced_conversations = models.PositiveIntegerField(default=0)
    unpriced_rounds = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "hour", "model"], name="usage_rollup_unique"),
        ]


class DerivationNote(models.Model):
    """Work to derive, written in the same transaction as the rows it is about (an
    outbox): conversations whose totals and links to refresh, minutes (or whole
    hours) whose tool rollups to recompute, artifacts to link. Drained by the web process's runner or
    the Celery workers (observatory.derive.drain); a note is deleted only after its work
    committed, so a crash at any moment leaves it to be drained again (the work is
    idempotent). A note that keeps failing is split down to one conversation,
    minute or hour, retried with backoff, and finally parked for an admin to look at.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    conversation_ids = models.JSONField(default=list)
    hours = models.JSONField(default=list)  # ISO starts of hours to recompute whole
    minutes = models.JSONField(default=list)  # ISO starts of minutes whose tool rollups to recompute
    artifact_ids = models.JSONField(default=list)
    trace_ids = models.JSONField(default=list)  # traces whose spans to link to their conversation
    created_at = models.DateTimeField(default=timezone.now)  # after its rows were stored
    # Before its rows were stamped received (the ingest request's time): a pass reads the
    # rows received from the earliest of its notes to the latest's created_at. Empty for
    # notes not written by an ingest request: from created_at less ROWS_BEFORE_NOTE.
    rows_from = models.DateTimeField(null=True, blank=True)
    available_at = models.DateTimeField(default=timezone.now)  # not drained before (backoff)
    claimed_until = models.DateTimeField(null=True, blank=True)  # a drainer's lease
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    parked = models.BooleanField(default=False)  # failed too often: waits for an admin

    class Meta:
        indexes = [
            models.Index(fields=["parked", "available_at"], name="note_ready"),
            models.Index(fields=["project"], name="note_project"),
        ]

    def __str__(self) -> str:
        return (f"note {self.pk}: {len(self.conversation_ids)} conversations, {len(self.minutes)} minutes, "
                f"{len(self.hours)} hours, {len(self.trace_ids)} traces")


class IngestTransport(models.TextChoices):
    """How a batch came in: what a broken-database answer is counted by."""

    OTLP_HTTP = "otlp_http", "OTLP/HTTP (web port)"
    OTLP_RECEIVER = "otlp_receiver", "OTLP/HTTP receiver (4318)"
    OTLP_GRPC = "otlp_grpc", "OTLP/gRPC"
    RECORDS = "records", "records API"
    ARTIFACTS = "artifacts", "artifacts API"
    API = "api", "other API"


class IngestDatabaseFault(models.Model):
    """Batches refused with a 500 (gRPC INTERNAL) because the database failed them
    the same way it would every time (a missing table, a constraint, a bad value:
    not a lock or a lost connection, which are 503 and retried), per project,
    transport and UTC day. Senders do not retry a 500, so these batches are lost:
    the admin shows the count, the server log each batch's error. Written by
    ``dashboard.ingest.common`` after the batch's transaction rolled back, in a
    transaction of its own. ``project`` is empty when the key could not be read."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    day = models.DateField()
    transport = models.CharField(max_length=16, choices=IngestTransport.choices)
    count = models.PositiveIntegerField(default=0)
    last_at = models.DateTimeField(default=timezone.now)
    last_error = models.CharField(max_length=200, blank=True)  # the driver error's type, never its text

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "day", "transport"], name="ingest_fault_unique"),
            models.UniqueConstraint(fields=["day", "transport"], condition=Q(project__isnull=True),
                                    name="ingest_fault_unique_no_project"),
        ]

    def __str__(self) -> str:
        return f"{self.count} broken-database answers ({self.transport}, {self.day})"
