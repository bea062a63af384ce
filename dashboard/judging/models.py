"""Scores, the project's score configs, and the history of each score's edits.

A score judges one thing: a conversation, a round, a tool call, a span (trace and
span id), a model response (``gen_ai.response.id``) or a whole trace. What the
sender named is kept as sent (``conversation_key``, ``round_key``, ``tool_call_id``,
``trace_id``, ``span_id``, ``response_id``); the rows it names are linked when known
(``conversation``, ``round``, ``tool_execution``): at once when they are stored
already, else by the scores' link pass when they arrive (``judging.links``). Rounds
and tool executions derived from spans may be replaced by the records that describe
them (observatory.derive.passes.span_rows), so those links are SET_NULL and found
again from the keys; a conversation's scores go with it (retention).

``score_id`` is the sender's (the API, an evaluator) or made from what is scored
(the pages, OpenTelemetry events): (project, score_id) is unique, so a retried score
is stored once, and the same id with another value is an edit, kept in ScoreEdit.

Every index below serves a query a page or the link pass makes; the comment says which.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from dashboard.accounts.models import ApiKey, Project
from dashboard.observatory.models import ID_LENGTH, TOOL_CALL_ID_LENGTH, Conversation, Round, ToolExecution

from .rules import LABEL_LENGTH, ScoreKind, config_problems


class ScoreSource(models.TextChoices):
    API = "api", "API"
    UI = "ui", "UI"
    OTEL = "otel", "OpenTelemetry"


class ScoreTarget(models.TextChoices):
    CONVERSATION = "conversation", "conversation"
    ROUND = "round", "round"
    TOOL_CALL = "tool_call", "tool call"
    SPAN = "span", "span"
    RESPONSE = "response", "model response"
    TRACE = "trace", "trace"


class ScoreConfig(models.Model):
    """What a score of this name may be, in one project. A score whose name has a
    config is checked against it (``judging.rules.score_refusal``) and refused
    when outside; a name with no config takes any value."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="score_configs", db_index=False)
    name = models.CharField(max_length=ID_LENGTH)
    kind = models.CharField(max_length=16, choices=ScoreKind.choices, default=ScoreKind.NUMERIC)
    min_value = models.FloatField(null=True, blank=True, help_text="numeric: the lowest value allowed")
    max_value = models.FloatField(null=True, blank=True, help_text="numeric: the highest value allowed")
    labels = models.JSONField(default=list, blank=True, help_text='categorical: the labels allowed, e.g. ["good", "bad"]')
    negative_labels = models.JSONField(
        default=list, blank=True, help_text="categorical: the labels that count as negative feedback"
    )
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="score_config_name_unique")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def clean(self) -> None:
        problems = config_problems(kind=self.kind, min_value=self.min_value, max_value=self.max_value,
                                   labels=self.labels, negative_labels=self.negative_labels)
        if problems:
            raise ValidationError(problems)


class Score(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    score_id = models.CharField(max_length=ID_LENGTH)
    name = models.CharField(max_length=ID_LENGTH)
    kind = models.CharField(max_length=16, choices=ScoreKind.choices)
    value = models.FloatField(null=True, blank=True)  # numeric, or 1/0 for a boolean
    label = models.CharField(max_length=LABEL_LENGTH, blank=True)
    comment = models.TextField(blank=True)
    # Negative feedback: false, a label the config calls negative, a number in the
    # lower half of the config's range (set on every write: judging.services).
    negative = models.BooleanField(default=False)
    source = models.CharField(max_length=8, choices=ScoreSource.choices)
    author_user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                    related_name="+")
    author_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    author_name = models.CharField(max_length=150, blank=True)  # kept when the user or key is gone
    occurred_at = models.DateTimeField(default=timezone.now)  # when the judgement was made
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    # What the sender named, as sent.
    target = models.CharField(max_length=16, choices=ScoreTarget.choices)
    conversation_key = models.CharField(max_length=ID_LENGTH, blank=True)
    round_key = models.CharField(max_length=ID_LENGTH, blank=True)
    tool_call_id = models.CharField(max_length=TOOL_CALL_ID_LENGTH, blank=True)
    trace_id = models.CharField(max_length=32, blank=True)
    span_id = models.CharField(max_length=16, blank=True)
    response_id = models.CharField(max_length=ID_LENGTH, blank=True)

    # The rows it names, once known.
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, null=True, blank=True,
                                     related_name="+", db_index=False)
    round = models.ForeignKey(Round, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
                              db_index=False)
    tool_execution = models.ForeignKey(ToolExecution, on_delete=models.SET_NULL, null=True, blank=True,
                                       related_name="+", db_index=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "score_id"], name="score_id_unique"),
        ]
        indexes = [
            # the scores list, newest first
            models.Index(fields=["project", "-occurred_at"], name="score_project_time"),
            # a name's distribution and mean over time
            models.Index(fields=["project", "name", "occurred_at"], name="score_project_name_time"),
            # a conversation's scores (timeline, list filters), and its cascade; with the
            # value and the negative flag it covers the compare page's counts and means
            # (a compared conversation may hold tens of thousands of scores: read from
            # the index alone, not row by row from the table)
            models.Index(fields=["conversation", "name", "value", "negative"], name="score_conversation_values",
                         condition=Q(conversation__isnull=False)),
            # SET_NULL when a round or tool execution goes
            models.Index(fields=["round"], name="score_round", condition=Q(round__isnull=False)),
            models.Index(fields=["tool_execution"], name="score_tool_execution",
                         condition=Q(tool_execution__isnull=False)),
            # the trace page; the link pass by trace
            models.Index(fields=["project", "trace_id"], name="score_trace", condition=~Q(trace_id="")),
            # the link pass: scores still waiting for their conversation, by its key
            models.Index(fields=["project", "conversation_key"], name="score_waiting_conversation",
                         condition=Q(conversation__isnull=True) & ~Q(conversation_key="")),
            # the link pass: scores of a tool call, by its id
            models.Index(fields=["project", "tool_call_id"], name="score_tool_call", condition=~Q(tool_call_id="")),
        ]

    def __str__(self) -> str:
        return f"{self.name}={self.shown_value} on {self.target}"

    @property
    def shown_value(self) -> str:
        """The value as a reader says it: true/false, the label, the number."""
        if self.kind == ScoreKind.BOOLEAN:
            return "true" if self.value else "false"
        if self.value is None:
            return self.label
        number = f"{self.value:g}"
        return f"{number} ({self.label})" if self.label else number

    @property
    def linked(self) -> bool:
        """Whether what it judges is found: its conversation, and the round or tool
        call it names (judging.selectors.LINKED says the same to the database)."""
        if self.target == ScoreTarget.TOOL_CALL and self.tool_execution_id is None:
            return False
        if self.target == ScoreTarget.ROUND and self.round_id is None:
            return False
        return self.conversation_id is not None


class ScoreEdit(models.Model):
    """One change of a stored score: who (a user, an API key, an evaluator's key),
    through what, when, and each changed field's value before and after."""

    score = models.ForeignKey(Score, on_delete=models.CASCADE, related_name="edits")
    changed_at = models.DateTimeField(default=timezone.now)
    by_user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                related_name="+")
    by_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    by_name = models.CharField(max_length=150, blank=True)
    source = models.CharField(max_length=8, choices=ScoreSource.choices)
    changes = models.JSONField(default=dict)  # {"value": [before, after], "comment": [before, after], ...}

    class Meta:
        ordering = ["changed_at", "id"]

    def __str__(self) -> str:
        return f"{self.by_name or 'someone'} changed {', '.join(self.changes)}"


class ReviewQueue(models.Model):
    """A named list of conversations to review, filled from the conversation list's
    filters. ``query`` is the list's query string as the user gave it (a relative
    start, ``within=24h``, stays relative): the queue shows it in words, and a refill
    reads it again as of then, adding what matches now. The items are a snapshot: a
    conversation added stays in the queue when it no longer matches. ``filled_at``:
    the last fill (the time a relative filter was read at)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="review_queues", db_index=False)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    query = models.CharField(max_length=2000, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    filled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="review_queue_name_unique")]

    def __str__(self) -> str:
        return self.name


class ReviewStatus(models.TextChoices):
    PENDING = "pending", "to review"
    DONE = "done", "reviewed"
    SKIPPED = "skipped", "skipped"


class ReviewItem(models.Model):
    """One conversation of a queue. A reviewer claims it (``claimed_by`` until
    ``claimed_until``) so no one else is given it meanwhile; a claim that runs out
    frees it for the next reviewer."""

    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="items", db_index=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+", db_index=False)
    position = models.PositiveIntegerField()
    status = models.CharField(max_length=8, choices=ReviewStatus.choices, default=ReviewStatus.PENDING)
    claimed_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    claimed_until = models.DateTimeField(null=True, blank=True)
    done_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                related_name="+")
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # also the index of a queue's items in order
            models.UniqueConstraint(fields=["queue", "position"], name="review_item_position_unique"),
            models.UniqueConstraint(fields=["queue", "conversation"], name="review_item_conversation_unique"),
        ]
        indexes = [
            # the next item to give out: pending, in order
            models.Index(fields=["queue", "position"], name="review_item_pending",
                         condition=Q(status="pending")),
            # the cascade when a conversation goes
            models.Index(fields=["conversation"], name="review_item_conversation"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} #{self.position}"


class Dataset(models.Model):
    """A named set of cases kept from production (or imported) for an agent's
    regression runs: each item the input the model had, the output it gave, and
    the output expected."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="datasets", db_index=False)
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="dataset_name_unique")]

    def __str__(self) -> str:
        return self.name


class DatasetItem(models.Model):
    """One case. ``input``: the user message, the context the model saw (messages)
    and ``tools_offered`` to the model (where a span said) or else ``tools_called``;
    ``output``: what it answered and called, as
    recorded; ``expected_output``: what it should have (editable, any JSON). The
    source rows stay linked while they exist; ``source`` keeps their ids as text.
    ``item_id`` is unique in the dataset: adding the same round twice, or importing
    the same file twice, adds nothing."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="items", db_index=False)
    item_id = models.CharField(max_length=ID_LENGTH)
    input = models.JSONField(default=dict)
    output = models.JSONField(null=True, blank=True)
    expected_output = models.JSONField(null=True, blank=True)
    source = models.JSONField(default=dict, blank=True)  # {"conversation_id", "round_id", "trace_id"} as text
    metadata = models.JSONField(default=dict, blank=True)
    source_conversation = models.ForeignKey(Conversation, on_delete=models.SET_NULL, null=True, blank=True,
                                            related_name="+", db_index=False)
    source_round = models.ForeignKey(Round, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
                                     db_index=False)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # also the index of a dataset's items (by id for paging, by item_id for imports)
            models.UniqueConstraint(fields=["dataset", "item_id"], name="dataset_item_id_unique"),
        ]
        indexes = [
            models.Index(fields=["dataset", "id"], name="dataset_item_order"),
            # SET_NULL when a conversation or a round goes (retention)
            models.Index(fields=["source_conversation"], name="dataset_item_conversation",
                         condition=Q(source_conversation__isnull=False)),
            models.Index(fields=["source_round"], name="dataset_item_round", condition=Q(source_round__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.dataset} / {self.item_id}"


class ScoreHour(models.Model):
    """One score name's scores in one hour (UTC): over all (``dimension`` ""), or of
    one tool's calls (``tool``) or one model's rounds (``model``), ``group`` naming
    which. Recomputed whole from the score rows (judging.services.score_hours_refresh)
    when the hour is marked changed; the scores summary reads these, a few rows an
    hour, instead of every score of its range.

    ``counts``: the scores per label (categorical), per "true"/"false" (boolean), or
    per value (numeric, while an hour has at most MAX_HOUR_VALUES distinct ones; else
    null and the summary bins that name's values from the rows)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    hour = models.DateTimeField()
    name = models.CharField(max_length=ID_LENGTH)
    dimension = models.CharField(max_length=8, blank=True)
    group = models.CharField(max_length=ID_LENGTH, blank=True)
    kinds = models.JSONField(default=list)
    count = models.PositiveIntegerField(default=0)
    valued = models.PositiveIntegerField(default=0)  # scores with a value (numbers and booleans)
    value_sum = models.FloatField(default=0.0)
    negatives = models.PositiveIntegerField(default=0)
    low = models.FloatField(null=True, blank=True)  # numeric scores' lowest and highest value
    high = models.FloatField(null=True, blank=True)
    counts = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            # also the summary's read: a project's hours in a range
            models.UniqueConstraint(fields=["project", "hour", "name", "dimension", "group"],
                                    name="score_hour_unique"),
        ]


class ScoreHourChanged(models.Model):
    """An hour whose scores changed since its ScoreHour rows were computed. Written by
    the database itself (triggers on judging_score, migration 0004: every insert,
    update and delete, a conversation's cascade included), so no write path can
    forget it; no unique key, so concurrent writers never wait on one another here. No
    database constraint to the project: deleting a project deletes its scores, whose
    triggers mark hours of a project that is going (the marks are then left, unread)."""

    project = models.ForeignKey(Project, on_delete=models.DO_NOTHING, related_name="+", db_index=False,
                                db_constraint=False)
    hour = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["project", "hour"], name="score_hour_changed")]


class EvaluationRefusal(models.Model):
    """How many OpenTelemetry ``gen_ai.evaluation.result`` events of one score name
    (``name`` "": events with no name) the project's ingest refused, and why the last
    one was. The exporter is told in the answer (``partial_success``), but SDKs log
    it at best: this is where the admin and the scores page show it. Counted in the
    batch's own transaction (judging.services.evaluation_refusals_count)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=ID_LENGTH, blank=True)
    count = models.PositiveBigIntegerField(default=0)
    last_reason = models.CharField(max_length=300, blank=True)
    first_at = models.DateTimeField(default=timezone.now)
    last_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-last_at", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="evaluation_refusal_unique")]

    def __str__(self) -> str:
        return f"{self.name or '(no name)'}: {self.count} refused"
