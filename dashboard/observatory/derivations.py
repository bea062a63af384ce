"""The derived data, recomputed from the rows: conversation totals and per-round
context tokens, hourly tool rollups, and the links between spans and records.

Each function recomputes from scratch what it is asked about (never increments),
so running it twice, or after a retried batch, gives the same result. Each batches:
a fixed number of grouped queries for any number of conversations or hours.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterable

from django.db import connections, router, transaction
from django.db.models import Model
from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, Subquery, Sum, Window
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import RowNumber
from django.utils import timezone

from dashboard.priority import yield_to_pages

from . import conventions, costs
from .dbfunctions import HourUTC, MinuteUTC
from .histogram import LATENCY_BUCKET_BOUNDS_MS, bucket_index, empty_histogram
from .paging import keyset_pages
from .span_rows import received_window
from .trace_links import trace_conversations_record
from .models import (
    Artifact,
    CompressionEvent,
    Conversation,
    ConversationMinute,
    Message,
    Round,
    SkillActivation,
    SPAN_TOOL_UNDERIVED,
    Span,
    ToolExecution,
    ToolHourlyRollup,
    ToolMinuteRollup,
    hour_of,
    minute_of,
)

TITLE_LENGTH = 120
LINK_WINDOW = timedelta(days=2)  # how far back the beat's pass looks for unlinked rows
BEAT_SPAN_LIMIT = 5_000  # unlinked spans one beat pass loads, the newest first (bounds its memory too)
LINK_CHUNK = 2_000  # tool executions one step of the link pass reads at once
SPAN_STATUS_ERROR = 2


# --- conversation totals ------------------------------------------------------------

def _grouped(queryset: Any, **aggregates: Any) -> dict[int, dict[str, Any]]:
    return {
        row["conversation_id"]: row
        for row in queryset.values("conversation_id").order_by().annotate(**aggregates)
    }


def _title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"


def conversation_totals_refresh(*, conversation_ids: Iterable[int], minutes: Iterable[datetime] | None = None) -> int:
    """Recompute totals, title, model, user, status and activity times of the given
    conversations, and the per-round context tokens; returns how many were updated.

    Tool calls, errors and retries are the sums of the conversations' minute slices
    (ConversationMinute): with ``minutes`` (what a pass after batches knows changed:
    the minutes its batches' tool rows fall in) only those slices are recomputed from
    rows; without (a rebuild), all of them. A conversation with no slice yet is
    rebuilt whole either way. Activity times come from each table's first and last
    row through the conversation's indexes; rounds, messages, compressions and
    skill activations are counted whole (they grow with the model's calls, not with
    the tool calls).

    The reads run outside any transaction (on SQLite a write transaction holds
    the write lock); the write is one short transaction that locks the
    conversations (rows on PostgreSQL, in id order so two passes cannot deadlock;
    SQLite's IMMEDIATE transaction takes the write lock), writes the slices no pass
    begun later has written, sums the slices, and writes only the conversations that
    no pass begun later has written: ``totals_updated_at`` is when the writing pass
    began. A pass that began later read everything committed before it began, so
    the newest figures win whatever order two drainers finish in (without that a
    pass that read before a batch committed could write its stale totals over the
    pass that read the batch, and nothing would correct them: the chaos benchmark
    caught one such conversation). A conversation a later pass has written, but
    whose slices this pass changed after that pass summed them, gets a note: the
    next pass sums them again.
    """
    ids = sorted(set(conversation_ids))
    if not ids:
        return 0
    began = timezone.now()
    slices = _slices_read(ids, None if minutes is None else sorted({minute_of(m) for m in minutes}))
    conversations, round_updates, pricing = _conversation_totals_read(ids, slices)
    yield_to_pages()
    with transaction.atomic():
        current = {
            row["pk"]: row for row in Conversation.objects.select_for_update().filter(pk__in=ids).order_by("pk")
            .values("pk", "totals_updated_at", "project_id", "started_at", *_KEPT_UNLESS_DERIVED)
        }
        changed_slices = _slices_write(slices, began)
        fresh = [c for c in conversations if c.pk in current
                 and (current[c.pk]["totals_updated_at"] is None or current[c.pk]["totals_updated_at"] <= began)]
        keep = {conversation.pk for conversation in fresh}
        _slices_sum(fresh)
        for conversation in fresh:
            now = current[conversation.pk]
            if now["started_at"] is not None:  # the hour it leaves, as it is now (another pass may have moved it)
                pricing.hours[now["project_id"]].add(hour_of(now["started_at"]))
            for name, read in conversation.kept_as_read.items():
                if getattr(conversation, name) == read:  # not derived here: what another writer set since stays
                    setattr(conversation, name, now[name])
            conversation.totals_updated_at = began
        update_rows(
            Conversation, fresh,
            ["rounds", "messages", "tool_calls", "errors", "retries", "input_tokens", "output_tokens",
             "max_context_tokens", "compressions", "has_errors", "title", "model", "user_id", "status",
             "started_at", "last_activity_at", "totals_updated_at"] + costs.CONVERSATION_FIELDS,
        )
        update_rows(Round, [r for r in round_updates if r.conversation_id in keep],
                    ["derived_context_tokens", "tool_call_count", "error_count"])
        pricing.rounds = [r for r in pricing.rounds if r.conversation_id in keep]
        pricing.save()  # [costs] round costs and the hourly usage rollups
        _resum_later({pk: current[pk]["project_id"] for pk in changed_slices if pk in current and pk not in keep})
    return len(fresh)


# Fields a pass keeps as it read them when the rows say nothing new (no user message,
# no round with a model or user): another writer may set them meanwhile (the span-row
# pass sets a user from the naming spans), and the totals' write must not undo that.
_KEPT_UNLESS_DERIVED = ("title", "model", "user_id")
_SLICE_FIGURES = ("tool_calls", "tool_errors", "retries", "tool_model")
SLICE_RANGES = 50  # minute ranges one slice query reads (ORed)


def _conversation_totals_read(ids: list[int], slices: _SlicesRead) -> tuple[
        list[Conversation], list[Round], Any]:
    """The conversations with their figures recomputed (but those of the tool calls:
    ``_slices_sum``), the rounds whose context changed, and their pricing: reads only."""
    conversations = list(Conversation.objects.filter(pk__in=ids).order_by("pk"))
    for conversation in conversations:
        conversation.kept_as_read = {name: getattr(conversation, name) for name in _KEPT_UNLESS_DERIVED}
    rounds = _grouped(
        Round.objects.filter(conversation_id__in=ids),
        n=Count("id"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"),
        max_context=Max("context_tokens"), errors=Count("id", filter=Q(status="error")),
        first=Min("occurred_at"), last=Max("occurred_at"),
    )
    messages = _grouped(
        Message.objects.filter(conversation_id__in=ids), n=Count("id"),
        first=Min("occurred_at"), last=Max("occurred_at"),
    )
    compressions = _grouped(
        CompressionEvent.objects.filter(conversation_id__in=ids), n=Count("id"),
        first=Min("occurred_at"), last=Max("occurred_at"),
    )
    skills = _grouped(
        SkillActivation.objects.filter(conversation_id__in=ids),
        errors=Count("id", filter=Q(success=False)), first=Min("occurred_at"), last=Max("occurred_at"),
    )

    # One row of each per conversation, found through the conversation's index by
    # the database: never all of a long conversation's messages, rounds, tool
    # executions or spans (the tool executions and spans grow by thousands a minute).
    firsts_and_lasts = {row["pk"]: row for row in Conversation.objects.filter(pk__in=ids).annotate(
        first_user_message=_first(Message.objects.filter(role="user", is_meta=False), "content", "index"),
        first_round_message=_first(Round.objects.exclude(user_message=""), "user_message", "index", "occurred_at"),
        last_round_model=_first(Round.objects.all(), "model", "-index", "-occurred_at"),
        last_round_user=_first(Round.objects.all(), "user_id", "-index", "-occurred_at"),
        last_round_status=_first(Round.objects.all(), "status", "-index", "-occurred_at"),
        first_tool=_first(ToolExecution.objects.all(), "occurred_at", "occurred_at"),  # toolexec_conversation_time
        last_tool=_first(ToolExecution.objects.all(), "occurred_at", "-occurred_at"),
        first_span=_first(Span.objects.all(), "start_time", "start_time"),  # span_conversation_time
        last_span=_first(Span.objects.all(), "end_time", "-end_time"),  # span_conversation_end
    ).values("pk", "first_user_message", "first_round_message", "last_round_model", "last_round_user",
             "last_round_status", "first_tool", "last_tool", "first_span", "last_span")}

    for conversation in conversations:
        pk = conversation.pk
        r, m = rounds.get(pk, {}), messages.get(pk, {})
        c, s = compressions.get(pk, {}), skills.get(pk, {})
        row = firsts_and_lasts[pk]
        conversation.rounds = r.get("n", 0)
        conversation.messages = m.get("n", 0)
        conversation.errors_but_tools = r.get("errors", 0) + s.get("errors", 0)  # + the slices' (_slices_sum)
        conversation.input_tokens = r.get("input_tokens") or 0
        conversation.output_tokens = r.get("output_tokens") or 0
        conversation.max_context_tokens = r.get("max_context") or 0
        conversation.compressions = c.get("n", 0)
        text = row["first_user_message"] or row["first_round_message"] or ""
        conversation.title = _title(text) if text else conversation.title
        last_round = row["last_round_status"] is not None
        # the last round's model, else (_slices_sum) the last tool call's that names one
        conversation.round_model = row["last_round_model"] if last_round else ""
        conversation.user_id = row["last_round_user"] if last_round and row["last_round_user"] else conversation.user_id
        conversation.status = (
            Conversation.Status.ERROR if row["last_round_status"] == "error" else Conversation.Status.OK
        )
        firsts = [g["first"] for g in (r, m, c, s) if g.get("first")] + [
            row[name] for name in ("first_tool", "first_span") if row[name]]
        lasts = [g["last"] for g in (r, m, c, s) if g.get("last")] + [
            row[name] for name in ("last_tool", "last_span") if row[name]]
        if firsts:
            conversation.started_at = min(firsts)
            conversation.last_activity_at = max(lasts)
    # Pricing falls back to the conversation's model: as the slices will say.
    _models_from_slices(conversations, _last_tool_models(ids, slices.found))

    pricing = costs.conversations_priced(conversations)  # [costs] reads the old start hours
    with_rounds = [pk for pk in ids if rounds.get(pk, {}).get("n")]
    return conversations, _round_context(with_rounds), pricing


# --- a conversation's minute slices ------------------------------------------------------

def _minute_ranges(minutes: list[datetime]) -> list[tuple[datetime, datetime]]:
    """Sorted minutes as [start, end) ranges of consecutive minutes."""
    ranges: list[list[datetime]] = []
    for minute in minutes:
        if ranges and ranges[-1][1] == minute:
            ranges[-1][1] = minute + timedelta(minutes=1)
        else:
            ranges.append([minute, minute + timedelta(minutes=1)])
    return [(start, end) for start, end in ranges]


@dataclass
class _SlicesRead:
    """What a totals pass read of its conversations' minute slices, to write them."""

    whole: list[int]  # conversations counted whole (no slice yet, or a rebuild)
    ranged: list[int]  # conversations counted in ``ranges``
    ranges: list[tuple[datetime, datetime]]
    found: dict[int, dict[datetime, dict[str, Any]]]  # conversation -> minute -> figures

    def covered(self, model: type[Model], field: str) -> list[Any]:
        """Queries for the rows of ``model`` (by its time ``field``) these slices cover."""
        queries = [model.objects.filter(conversation_id__in=self.whole)] if self.whole else []
        for start in range(0, len(self.ranges) if self.ranged else 0, SLICE_RANGES):
            in_ranges = Q()
            for low, high in self.ranges[start:start + SLICE_RANGES]:
                in_ranges |= Q(**{f"{field}__gte": low, f"{field}__lt": high})
            queries.append(model.objects.filter(in_ranges, conversation_id__in=self.ranged))
        return queries


_EMPTY_SLICE = {"tool_calls": 0, "tool_errors": 0, "retries": 0, "tool_model": ""}


def _slices_read(ids: list[int], minutes: list[datetime] | None) -> _SlicesRead:
    """The slices of these conversations in ``minutes`` (None: all), counted from the
    tool rows. Reads only."""
    with_slices = set() if minutes is None else set(
        ConversationMinute.objects.filter(conversation_id__in=ids).values_list("conversation_id", flat=True)
        .distinct())
    read = _SlicesRead(whole=[pk for pk in ids if pk not in with_slices], ranged=sorted(with_slices),
                       ranges=_minute_ranges(minutes or []), found={pk: {} for pk in ids})
    for query in read.covered(ToolExecution, "occurred_at"):
        by_minute = query.annotate(minute=MinuteUTC("occurred_at"))
        for row in by_minute.values("conversation_id", "minute").order_by().annotate(
            n=Count("id"), errors=Count("id", filter=Q(success=False)), retries=Sum("retry_count"),
        ):
            read.found[row["conversation_id"]][minute_of(row["minute"])] = {
                **_EMPTY_SLICE, "tool_calls": row["n"], "tool_errors": row["errors"], "retries": row["retries"] or 0}
        # The minute's last call that names a model, one row per slice, picked by the
        # database: the calls themselves were read before, and when every record names
        # its model (the demo agent's do) a sweep of 200 conversations x 10 minutes
        # held all their rows at once (a worker grew by 40-70 MB in the soak).
        last_named = by_minute.exclude(model="").annotate(latest=Window(
            RowNumber(), partition_by=[F("conversation_id"), F("minute")],
            order_by=[F("occurred_at").desc(), F("id").desc()],
        )).filter(latest=1)
        for conversation_id, minute, model in last_named.values_list("conversation_id", "minute", "model"):
            entry = read.found[conversation_id].get(minute_of(minute))
            if entry is not None:  # else stored between the two queries: the next pass counts it
                entry["tool_model"] = model
    return read


def _slices_write(read: _SlicesRead, began: datetime) -> set[int]:
    """Write the slices read, and zeros for the stored ones they cover that no rows
    fill any more, but none a pass begun after ``began`` wrote; inside the totals'
    transaction. Returns the conversations whose slices changed."""
    stored: dict[tuple[int, datetime], tuple] = {}
    for query in read.covered(ConversationMinute, "minute"):
        for row in query.values_list("conversation_id", "minute", "updated_at", *_SLICE_FIGURES):
            stored[(row[0], row[1])] = row[2:]
    for pk, minute in stored:
        read.found[pk].setdefault(minute, dict(_EMPTY_SLICE))
    rows, changed = [], set()
    for pk, found in read.found.items():
        for minute, figures in found.items():
            was = stored.get((pk, minute))
            if was is not None and was[0] > began:
                continue  # written by a pass begun later
            # Stamped even when unchanged: a pass begun earlier may have read a state between.
            rows.append(ConversationMinute(conversation_id=pk, minute=minute, updated_at=began, **figures))
            if was is None or was[1:] != tuple(figures[name] for name in _SLICE_FIGURES):
                changed.add(pk)
    ConversationMinute.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["conversation", "minute"],
        update_fields=[*_SLICE_FIGURES, "updated_at"],
    )
    return changed


def _last_tool_models(ids: list[int], found: dict[int, dict[datetime, dict[str, Any]]] | None = None
                      ) -> dict[int, str]:
    """Each conversation's model of its last tool call naming one, from its stored
    slices; with ``found`` (slices read, not written yet) a later minute of theirs wins."""
    models = {}
    for pk, minute, model in Conversation.objects.filter(pk__in=ids).annotate(
        minute=_first(ConversationMinute.objects.exclude(tool_model=""), "minute", "-minute"),
        model_of_tools=_first(ConversationMinute.objects.exclude(tool_model=""), "tool_model", "-minute"),
    ).values_list("pk", "minute", "model_of_tools"):
        read = [(m, 1, figures["tool_model"]) for m, figures in (found or {}).get(pk, {}).items()
                if figures["tool_model"]]  # 1: for the same minute, what was just read wins
        latest = max(read + ([(minute, 0, model)] if model else []), default=None)
        if latest:
            models[pk] = latest[2]
    return models


def _models_from_slices(conversations: list[Conversation], tool_models: dict[int, str]) -> None:
    for conversation in conversations:
        conversation.model = conversation.round_model or tool_models.get(conversation.pk, conversation.model)


def _slices_sum(conversations: list[Conversation]) -> None:
    """Tool calls, errors, retries and the model when no round names one: from the
    slices as stored now (inside the totals' transaction, after ``_slices_write``)."""
    ids = [conversation.pk for conversation in conversations]
    sums = _grouped(ConversationMinute.objects.filter(conversation_id__in=ids),
                    n=Sum("tool_calls"), errors=Sum("tool_errors"), retries=Sum("retries"))
    _models_from_slices(conversations, _last_tool_models(ids))
    for conversation in conversations:
        figures = sums.get(conversation.pk, {})
        conversation.tool_calls = figures.get("n") or 0
        conversation.retries = figures.get("retries") or 0
        conversation.errors = conversation.errors_but_tools + (figures.get("errors") or 0)
        conversation.has_errors = conversation.errors > 0


def _resum_later(projects: dict[int, int]) -> None:
    """Notes for the conversations whose slices this pass changed after a pass begun
    later had summed them (that pass wrote their totals, so this one may not)."""
    from .outbox import note_write

    by_project: dict[int, list[int]] = defaultdict(list)
    for pk, project_id in projects.items():
        by_project[project_id].append(pk)
    for project_id, pks in by_project.items():
        note_write(project_id=project_id, conversation_ids=sorted(pks), hours=[], artifact_ids=[])


def slices_sweep(*, project_id: int, since: datetime, step: Callable[[], ContextManager[Any]] = nullcontext) -> int:
    """Recompute the minute slices since ``since`` of the project's conversations with
    tool rows in them (the hourly beat: what a pass lost to a race left), at most
    SWEEP_CONVERSATIONS conversations and SWEEP_MINUTES minutes a step, each step
    inside ``step()`` (the beat: on SQLite, the drain lock, so the outbox drains between
    steps). Returns the conversations updated."""
    start, end = minute_of(since), minute_of(timezone.now()) + timedelta(minutes=1)
    updated = 0
    while start < end:
        stop = min(start + timedelta(minutes=SWEEP_MINUTES), end)
        ids = sorted(set(ToolExecution.objects.filter(project_id=project_id, occurred_at__gte=start,
                                                      occurred_at__lt=stop)
                         .values_list("conversation_id", flat=True).distinct()))
        minutes = [start + timedelta(minutes=i) for i in range(int((stop - start) / timedelta(minutes=1)))]
        for first in range(0, len(ids), SWEEP_CONVERSATIONS):
            with step():
                updated += conversation_totals_refresh(conversation_ids=ids[first:first + SWEEP_CONVERSATIONS],
                                                       minutes=minutes)
            yield_to_pages()
        start = stop
    return updated


SWEEP_CONVERSATIONS = 200
SWEEP_MINUTES = 10


def _first(rows: Any, field: str, *order: str) -> Subquery:
    """``field`` of a conversation's first row of ``rows`` in ``order``, as a subquery."""
    return Subquery(rows.filter(conversation_id=OuterRef("pk")).order_by(*order).values(field)[:1])


def update_rows(model: type[Model], objs: list[Model], field_names: list[str]) -> None:
    """UPDATE … WHERE id = %s for each object, as one executemany: what bulk_update
    does without building a CASE expression per field and row."""
    if not objs:
        return
    connection = connections[router.db_for_write(model)]
    fields = [model._meta.get_field(name) for name in field_names]
    quote = connection.ops.quote_name
    sql = "UPDATE {} SET {} WHERE {} = %s".format(
        quote(model._meta.db_table),
        ", ".join(f"{quote(f.column)} = %s" for f in fields),
        quote(model._meta.pk.column),
    )
    params = [[f.get_db_prep_save(getattr(obj, f.attname), connection) for f in fields] + [obj.pk] for obj in objs]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _round_context(conversation_ids: list[int]) -> list[Round]:
    """Per-round context size (reported, else the running sum of message tokens up
    to the round) and the round's tool calls and errors; only changed rounds."""
    message_tokens: dict[tuple[int, str], int] = {
        (row["conversation_id"], row["round_id"]): row["tokens"] or 0
        for row in Message.objects.filter(conversation_id__in=conversation_ids)
        .values("conversation_id", "round_id").order_by().annotate(tokens=Sum("tokens"))
    }
    tool_counts = {
        (row["conversation_id"], row["round_id"]): row
        for row in ToolExecution.objects.filter(conversation_id__in=conversation_ids)
        .values("conversation_id", "round_id").order_by()
        .annotate(n=Count("id"), errors=Count("id", filter=Q(success=False)))
    }
    changed = []
    running: dict[int, int] = defaultdict(int)
    for round_ in Round.objects.filter(conversation_id__in=conversation_ids).order_by(
        "conversation_id", "index", "occurred_at"
    ).only("id", "conversation_id", "round_id", "context_tokens", "derived_context_tokens",
           "tool_call_count", "error_count"):
        key = (round_.conversation_id, round_.round_id)
        running[round_.conversation_id] += message_tokens.get(key, 0)
        derived = round_.context_tokens or running[round_.conversation_id]
        tools = tool_counts.get(key, {})
        values = (derived, tools.get("n", 0), tools.get("errors", 0))
        if values != (round_.derived_context_tokens, round_.tool_call_count, round_.error_count):
            round_.derived_context_tokens, round_.tool_call_count, round_.error_count = values
            changed.append(round_)
    return changed


# --- hourly tool rollups --------------------------------------------------------------

def _histogram_aggregates() -> dict[str, Any]:
    aggregates: dict[str, Any] = {}
    lower = None
    for i, upper in enumerate(LATENCY_BUCKET_BOUNDS_MS):
        condition = Q(duration_ms__lte=upper)
        if lower is not None:
            condition &= Q(duration_ms__gt=lower)
        aggregates[f"b{i}"] = Count("id", filter=condition)
        lower = upper
    aggregates[f"b{len(LATENCY_BUCKET_BOUNDS_MS)}"] = Count("id", filter=Q(duration_ms__gt=lower))
    return aggregates


_LEVELS = ("brief", "standard", "full")
_TIMEOUT = Q(error_type__iexact="timeout") | Q(error_code__iexact="timeout")


def _empty_rollup() -> dict[str, Any]:
    return {
        "calls": 0, "successes": 0, "errors": 0, "retries": 0, "timeouts": 0, "cache_hits": 0,
        "duration_sum_ms": 0.0, "latency_histogram": empty_histogram(), "error_types": Counter(),
        "cost_pico_usd": 0, "priced_calls": 0,  # [costs]
        **{f"{level}_{kind}": 0 for level in _LEVELS for kind in ("tokens", "count")},
    }


ROLLUP_SLICE = timedelta(minutes=1)  # a slice is what models.minute_of names
# The slice every recompute of a minute writes, whatever the minute holds: a pass that
# finds a minute empty (its rows deleted since: a record won over a derived call) still
# says when it read, so a pass begun earlier cannot write its stale slices over it. No
# tool has an empty name (ingest and the span-row pass give one), and the hour's sum skips it.
MINUTE_MARK = ""


def tool_rollups_refresh(*, project_id: int, hours: Iterable[datetime] = (), minutes: Iterable[datetime] = (),
                         step: Callable[[], ContextManager[Any]] = nullcontext) -> int:
    """Recompute tool statistics from the rows, minute by minute: the given
    minutes, and every minute of the given hours (the sweep, a repricing, a note
    written before the slices); then sum each hour touched from its minute slices.
    Returns the hour rollups written.

    A minute's slice counts the minute's tool executions plus its tool spans that
    no tool execution describes; a slice of a tool that has no rows left in the
    minute is deleted. A batch's rows fall in the minutes around now, so its pass
    reads seconds of rows: recomputing its whole hour read up to an hour of them,
    and 25 minutes into the hour-long soak that was 75 % of the derivation's time.

    A slice says when the pass that wrote it began reading (``updated_at``), and a
    pass writes a slice only when no pass that began later has written it: two
    drainers recomputing one minute can finish in any order, and the one that read
    first would otherwise overwrite the newer figures with stale ones that no later
    note corrects (the soak once ended 1,462 calls behind so). The hour's sum is
    taken in the same transaction, from the slices as they are then. That
    transaction is inside ``step()``; the reading before it is not (the beat: on
    SQLite the drain lock is held for an hour's writes, not for reading its rows)."""
    by_hour: dict[datetime, list[datetime]] = defaultdict(list)
    for minute in rollup_minutes(hours=hours, minutes=minutes):
        by_hour[hour_of(minute)].append(minute)
    written = 0
    for hour, hour_minutes in sorted(by_hour.items()):
        began = timezone.now()
        slices = {minute: _minute_stats(project_id, minute) for minute in hour_minutes}
        with step(), transaction.atomic():
            newer = _slices_newer(project_id, hour, hour_minutes, began)
            fresh = {minute: stats for minute, stats in slices.items() if minute not in newer}
            ToolMinuteRollup.objects.filter(project_id=project_id, minute__in=list(fresh)).delete()
            ToolMinuteRollup.objects.bulk_create(
                ToolMinuteRollup(project_id=project_id, minute=minute, tool_name=tool_name, updated_at=began,
                                 **{**entry, "error_types": dict(entry["error_types"])})
                for minute, stats in fresh.items()
                for tool_name, entry in [(MINUTE_MARK, _empty_rollup()), *stats.items()]
            )
            written += _hour_sum(project_id, hour)
        seconds = (timezone.now() - began).total_seconds()
        for minute in hour_minutes:
            _recompute_cost_note(project_id, minute, seconds / len(hour_minutes))
    return written


def rollup_minutes(*, hours: Iterable[datetime] = (), minutes: Iterable[datetime] = ()) -> list[datetime]:
    """The minutes to recompute, in order: the given ones, and every minute of the given hours."""
    wanted = {minute_of(minute) for minute in minutes}
    for hour in {hour_of(hour) for hour in hours}:
        wanted.update(hour + i * ROLLUP_SLICE for i in range(timedelta(hours=1) // ROLLUP_SLICE))
    return sorted(wanted)


def _minute_stats(project_id: int, start: datetime) -> dict[str, dict[str, Any]]:
    """Each tool's figures in the minute from ``start``, read from the rows: a few
    grouped queries, and five extracted attribute values per span-only call."""
    end = start + ROLLUP_SLICE
    stats: dict[str, dict[str, Any]] = defaultdict(_empty_rollup)
    executions = ToolExecution.objects.filter(project_id=project_id, occurred_at__gte=start, occurred_at__lt=end)
    level_aggregates = {}
    for level in _LEVELS:
        level_aggregates[f"{level}_tokens"] = Sum("observation_tokens", filter=Q(output_level=level))
        level_aggregates[f"{level}_count"] = Count("id", filter=Q(output_level=level))
    for row in executions.values("tool_name").order_by().annotate(
        calls=Count("id"), successes=Count("id", filter=Q(success=True)),
        errors=Count("id", filter=Q(success=False)), retries=Sum("retry_count"),
        timeouts=Count("id", filter=Q(success=False) & _TIMEOUT),
        cache_hits=Count("id", filter=Q(cache_hit=True)), duration_sum_ms=Sum("duration_ms"),
        **level_aggregates, **_histogram_aggregates(),
    ):
        entry = stats[row["tool_name"]]
        for name in ("calls", "successes", "errors", "retries", "timeouts", "cache_hits", "duration_sum_ms",
                     *level_aggregates):
            entry[name] = row[name] or 0
        entry["latency_histogram"] = [row[f"b{i}"] for i in range(len(LATENCY_BUCKET_BOUNDS_MS) + 1)]
    if stats:
        for row in executions.filter(success=False).values("tool_name", "error_type").order_by().annotate(
                n=Count("id")):
            stats[row["tool_name"]]["error_types"][row["error_type"] or "unknown"] += row["n"]
        costs.tool_call_costs(stats, executions, start)  # [costs] observation tokens at the input price

    # Five attribute values per span, extracted by the database, read in chunks:
    # never the spans' whole attributes, never all of a minute's spans at once.
    span_only = span_only_calls(project_id, start, end).annotate(**_SPAN_FACTS)
    for span in span_only.values_list("tool_name", "duration_ms", "status_code",
                                      *_SPAN_FACTS).iterator(chunk_size=_SPAN_CHUNK):
        _add_span(stats[span[0]], span[1], span[2], dict(zip(_SPAN_FACT_KEYS, span[3:])))
        if stats[span[0]]["calls"] % _SPAN_CHUNK == 0:
            yield_to_pages()
    return stats


# The figures an hour adds up from its slices: all but the histogram and the error types.
_SUMMED = tuple(name for name in _empty_rollup() if name not in ("latency_histogram", "error_types"))


def _hour_sum(project_id: int, hour: datetime) -> int:
    """Write the hour's rollups as the sums of its minute slices (at most sixty a
    tool); a tool with no slice left loses its hour rollup. Returns rows written."""
    stats: dict[str, dict[str, Any]] = defaultdict(_empty_rollup)
    for minute in ToolMinuteRollup.objects.filter(project_id=project_id, minute__gte=hour,
                                                  minute__lt=hour + timedelta(hours=1)).exclude(tool_name=MINUTE_MARK):
        entry = stats[minute.tool_name]
        for name in _SUMMED:
            entry[name] += getattr(minute, name)
        entry["latency_histogram"] = [a + b for a, b in zip(entry["latency_histogram"], minute.latency_histogram)]
        entry["error_types"].update(minute.error_types)
    ToolHourlyRollup.objects.filter(project_id=project_id, hour=hour).exclude(tool_name__in=list(stats)).delete()
    now = timezone.now()
    ToolHourlyRollup.objects.bulk_create(
        [ToolHourlyRollup(project_id=project_id, tool_name=tool_name, hour=hour, updated_at=now,
                          **{**entry, "error_types": dict(entry["error_types"])})
         for tool_name, entry in stats.items()],
        update_conflicts=True, unique_fields=["project", "tool_name", "hour"],
        update_fields=[f for f in _empty_rollup()] + ["updated_at"],
    )
    return len(stats)


# What the last recompute of a minute cost, in seconds, as this process saw it: a busy
# minute is recomputed at most once per ROLLUP_COST_SPACING times that (rollup_minutes_due).
ROLLUP_COST_SPACING = 4
_recompute_costs: dict[tuple[int, datetime], float] = {}
_RECOMPUTE_COSTS_KEPT = 10_000


def _recompute_cost_note(project_id: int, minute: datetime, seconds: float) -> None:
    if len(_recompute_costs) >= _RECOMPUTE_COSTS_KEPT:
        _recompute_costs.clear()  # old minutes; the next recompute of each learns again
    _recompute_costs[(project_id, minute)] = seconds


def span_only_calls(project_id: int, start: datetime, end: datetime) -> Any:
    """The tool spans started in [start, end) that no tool execution describes:
    not by tool_call_id, and not as the span a tool execution (a record's, or one
    derived from the span) links to. Only among those no span-row pass derives
    (``span_tool_underived``): a tool span of a conversation is counted as the tool
    execution derived from it. Before, every tool span of the hour was read, with
    two lookups each, at every recompute: 44 % of the derivation's time 25 minutes
    into the hour-long soak."""
    described = ToolExecution.objects.filter(project_id=project_id, tool_call_id=OuterRef("tool_call_id"))
    linked = ToolExecution.objects.filter(linked_span_id=OuterRef("pk"))
    return (
        Span.objects.filter(SPAN_TOOL_UNDERIVED, project_id=project_id, start_time__gte=start, start_time__lt=end)
        .annotate(described=Exists(described), linked=Exists(linked))
        .filter(Q(described=False) | Q(tool_call_id=""))
        .filter(linked=False)
    )


def _slices_newer(project_id: int, hour: datetime, minutes: list[datetime], began: datetime) -> set[datetime]:
    """Inside the writing transaction: the minutes of ``hour`` among ``minutes``
    that a pass begun after ``began`` wrote. The check, the write and the hour's
    sum are one step per hour: on SQLite the IMMEDIATE transaction holds the write
    lock, on PostgreSQL a transaction-scoped advisory lock on (project, hour) does."""
    connection = connections[router.db_for_write(ToolMinuteRollup)]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [project_id, int(hour.timestamp()) // 3600])
    return set(ToolMinuteRollup.objects.filter(project_id=project_id, minute__in=minutes, updated_at__gt=began)
               .values_list("minute", flat=True).distinct())


def rollup_minutes_due(*, project_id: int, minutes: Iterable[datetime], interval: timedelta) -> tuple[
        list[datetime], list[datetime], datetime | None]:
    """(minutes due, minutes not due yet, when those are due): a minute is due
    when no pass began recomputing it within ``interval``, or within
    ROLLUP_COST_SPACING times what its last recompute took. Every batch of a busy
    minute would otherwise recompute it, on every drainer; the outbox recomputes a
    minute at most that often and notes the rest for then."""
    minutes = sorted({minute_of(minute) for minute in minutes})
    if interval <= timedelta(0) or not minutes:
        return minutes, [], None
    now = timezone.now()
    last = dict(ToolMinuteRollup.objects.filter(project_id=project_id, minute__in=minutes).values("minute")
                .order_by().annotate(last=Max("updated_at")).values_list("minute", "last"))
    next_due = {
        minute: last[minute] + max(interval, timedelta(
            seconds=ROLLUP_COST_SPACING * _recompute_costs.get((project_id, minute), 0.0)))
        for minute in minutes if minute in last
    }
    due = [minute for minute in minutes if minute not in next_due or next_due[minute] <= now]
    later = [minute for minute in minutes if minute in next_due and next_due[minute] > now]
    return due, later, max((next_due[minute] for minute in later), default=None)


# The span attributes a tool rollup reads, extracted as scalars by the database
# (SQLite's json_extract gives numbers and 1/0 for booleans, PostgreSQL's ->> text).
_SPAN_FACT_KEYS = ("ba.retry_count", "ba.cache_hit", "error.type", "ba.output_level", "ba.observation_tokens")
_SPAN_FACTS = {f"fact{i}": KeyTextTransform(key, "attributes") for i, key in enumerate(_SPAN_FACT_KEYS)}
_SPAN_CHUNK = 2_000


def _count(value: Any) -> int:
    """A non-negative whole number from an extracted attribute value, else 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.isdigit() and len(value) < 19:
        return int(value)
    return 0


def _add_span(entry: dict[str, Any], duration_ms: float, status_code: int, attributes: Any) -> None:
    attributes = attributes if isinstance(attributes, dict) else {}
    # Failed: status ERROR, or an error type (the GenAI conventions set error.type on failure).
    failed = status_code == SPAN_STATUS_ERROR or attributes.get("error.type") not in (None, "")
    entry["calls"] += 1
    entry["successes" if not failed else "errors"] += 1
    entry["retries"] += _count(attributes.get("ba.retry_count"))
    entry["cache_hits"] += 1 if attributes.get("ba.cache_hit") in (True, 1, "true", "1") else 0
    entry["duration_sum_ms"] += duration_ms or 0.0
    entry["latency_histogram"][bucket_index(duration_ms or 0.0)] += 1
    if failed:
        error_type = str(attributes.get("error.type") or "unknown")[:200]
        entry["error_types"][error_type] += 1
        entry["timeouts"] += 1 if error_type.lower() == "timeout" else 0
    level = attributes.get("ba.output_level")
    if level in _LEVELS:
        entry[f"{level}_count"] += 1
        entry[f"{level}_tokens"] += _count(attributes.get("ba.observation_tokens"))


def hours_with_rows(*, project_id: int, since: datetime) -> set[datetime]:
    """The hours since ``since`` that have tool executions or tool spans (one
    distinct hour per row group, truncated by the database: never the rows)."""
    hours = set(
        ToolExecution.objects.filter(project_id=project_id, occurred_at__gte=since)
        .annotate(hour=HourUTC("occurred_at")).values_list("hour", flat=True).distinct()
    )
    hours |= set(
        Span.objects.filter(project_id=project_id, start_time__gte=since).exclude(tool_name="")
        .annotate(hour=HourUTC("start_time")).values_list("hour", flat=True).distinct()
    )
    # Hours whose rows are gone still need their stale rollups removed.
    hours |= set(ToolHourlyRollup.objects.filter(project_id=project_id, hour__gte=hour_of(since))
                 .values_list("hour", flat=True))
    return {hour_of(hour) for hour in hours}


# --- links between spans and records ---------------------------------------------------

def links_refresh(
    *,
    project_id: int,
    conversation_ids: Iterable[int] | None = None,
    artifact_ids: Iterable[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    step: Callable[[], ContextManager[Any]] = nullcontext,
) -> dict[str, Any]:
    """Link what arrived recently and is still unlinked:

    - a tool execution to its span (by trace_id + span_id, else by tool_call_id),
      filling its trace/span ids when the record had none;
    - a span to its conversation: by gen_ai.conversation.id / session.id (creating
      the conversation when no record named it yet), else by the tool execution
      with its tool_call_id, else by another span of the same trace, else by a
      round record of the trace;
    - an artifact to the tool execution that names it, and its conversation.

    Scope: with ``conversation_ids`` (after a records batch) only the rows of those
    conversations received from ``since`` to ``until`` (the outbox passes the times
    of its notes' batches, so a pass reads what its batches brought, not the
    conversations' history nor the batches of later notes) and the spans that
    share their tool calls or traces; with ``artifact_ids`` (after an upload) only
    those artifacts. Every query is then bounded by those ids and served by an
    index, so the work after a batch is proportional to the batch, not to the
    database. With neither (the hourly
    beat): the unlinked rows that occurred or started since ``since``, through the
    time indexes, and at most BEAT_SPAN_LIMIT unlinked spans, the newest.

    Tool executions are read LINK_CHUNK at a time (``keyset_pages``), so memory is
    bounded by the chunk whatever the scope holds. Each page's links, and the spans'
    and artifacts' at the end, are written inside ``step()`` (the beat: on SQLite the
    drain lock, so the outbox drains between pages). Held for the whole pass, the lock
    kept every drainer out for minutes at the end of the hour-long soak: the beat read
    6.7M tool executions, 0.7M of them unlinked, and the last notes of the load waited.

    Only links are added, never changed, so running it again changes nothing.
    Returns counts, the ids of conversations that gained spans (their totals
    and activity times need a refresh) and the traces of those spans (where the
    spans to derive rows from are, whenever they were received).
    """
    since = since or timezone.now() - LINK_WINDOW
    counts: dict[str, Any] = {"tool_executions": 0, "spans": 0, "artifacts": 0, "conversations_created": 0}
    gained: set[int] = set()
    linked_traces: set[str] = set()  # of the spans linked to a conversation here
    scoped = conversation_ids is not None or artifact_ids is not None
    conversation_list = sorted(set(conversation_ids or ()))
    project_has_spans = Span.objects.filter(project_id=project_id).exists()
    unlinked_spans = Span.objects.filter(project_id=project_id, conversation__isnull=True)

    received = received_window(since, until)
    if scoped:
        # toolexec_project_received: the rows these batches brought, not the conversations' history.
        executions_in_scope = ToolExecution.objects.filter(
            project_id=project_id, conversation_id__in=conversation_list, **received)
        order = "received_at"
    else:
        # toolexec_project_time; the beat only links executions (spans below by their own query)
        executions_in_scope = ToolExecution.objects.filter(
            project_id=project_id, occurred_at__gte=since, linked_span__isnull=True)
        order = "occurred_at"
    # The beat reads executions only to link them to spans: none to link to, nothing to read.
    read = conversation_list if scoped else project_has_spans
    pages = keyset_pages(executions_in_scope, order, (
        "id", "tool_call_id", "trace_id", "span_id", "linked_span_id", "artifact_id"), LINK_CHUNK) if read else ()
    for in_scope in pages:
        with step():
            learned_traces = _executions_link(project_id, in_scope, counts) if project_has_spans else set()
            if project_has_spans and scoped:
                traces = {row[2] for row in in_scope if row[2]} | learned_traces
                _spans_link(project_id, _spans_by_calls_or_traces(
                    unlinked_spans, {row[1] for row in in_scope}, traces), counts, gained, linked_traces)
            if scoped and artifact_ids is None:
                named = {row[5] for row in in_scope if row[5]}
                if named:
                    _artifacts_link(project_id, Artifact.objects.filter(
                        project_id=project_id, tool_execution__isnull=True, artifact_id__in=named), counts)
        yield_to_pages()

    with step():
        # Spans -> conversations, by what is not a tool execution.
        if project_has_spans and conversation_list:
            # Traces a round record of these conversations describes (received in scope too).
            round_traces = set(
                Round.objects.filter(project_id=project_id, conversation_id__in=conversation_list, **received)
                .exclude(trace_id="").values_list("trace_id", flat=True)
            )
            _spans_link(project_id, _spans_by_calls_or_traces(unlinked_spans, set(), round_traces), counts, gained,
                        linked_traces)
        elif project_has_spans and not scoped:
            # span_project_time, newest first; received_at has no index to bound it by
            _spans_link(project_id, [unlinked_spans.filter(start_time__gte=since).order_by("-start_time")[:BEAT_SPAN_LIMIT]],
                        counts, gained, linked_traces)

        # Artifacts -> tool executions (after a records batch: those its executions name, above).
        if artifact_ids is not None:
            _artifacts_link(project_id, Artifact.objects.filter(
                project_id=project_id, tool_execution__isnull=True, artifact_id__in=set(artifact_ids)), counts)
        elif not scoped:
            _artifacts_link(project_id, Artifact.objects.filter(
                project_id=project_id, tool_execution__isnull=True, created_at__gte=since), counts)
    counts["conversation_ids"] = sorted(gained)
    counts["trace_ids"] = sorted(linked_traces)
    return counts


def _executions_link(project_id: int, in_scope: list[tuple], counts: dict[str, Any]) -> set[str]:
    """Tool executions -> spans; returns the traces of the executions linked."""
    executions = [row for row in in_scope if row[4] is None]
    if not executions:
        return set()
    by_call: dict[str, tuple[int, str, str]] = {}
    by_ids: dict[tuple[str, str], int] = {}
    for query in _spans_by_calls_or_traces(
        Span.objects.filter(project_id=project_id),
        {row[1] for row in executions}, {row[2] for row in executions if row[2]},
    ):
        for span in query.values_list("id", "trace_id", "span_id", "tool_call_id"):
            by_ids[(span[1], span[2])] = span[0]
            if span[3]:
                by_call[span[3]] = (span[0], span[1], span[2])
    changed = []
    for pk, tool_call_id, trace_id, span_id, _, _ in executions:
        span_pk = by_ids.get((trace_id, span_id))
        if span_pk is None and tool_call_id in by_call:
            span_pk, found_trace, found_span = by_call[tool_call_id]
            trace_id, span_id = trace_id or found_trace, span_id or found_span
        if span_pk is not None:
            changed.append(ToolExecution(pk=pk, linked_span_id=span_pk, trace_id=trace_id, span_id=span_id))
    update_rows(ToolExecution, changed, ["linked_span", "trace_id", "span_id"])
    counts["tool_executions"] += len(changed)
    return {execution.trace_id for execution in changed}


def _spans_link(project_id: int, queries: list[Any], counts: dict[str, Any], gained: set[int],
                linked_traces: set[str]) -> None:
    """Spans -> conversations, for the unlinked spans these queries find; adds the
    conversations to ``gained`` and the spans' traces to ``linked_traces``."""
    fields = ("id", "trace_id", "conversation_key", "tool_call_id", "attributes", "start_time", "end_time")
    spans = list({span.pk: span for query in queries for span in query.only(*fields)}.values())
    if not spans:
        return
    for span in spans:
        if not span.conversation_key:
            span.conversation_key = _conversation_key(span.attributes)
    keys = {span.conversation_key for span in spans if span.conversation_key}
    conversation_by_key = dict(
        Conversation.objects.filter(project_id=project_id, external_id__in=keys).values_list("external_id", "pk")
    )
    missing = keys - set(conversation_by_key)
    if missing:
        from dashboard.accounts.models import Project

        from .services import conversations_get_or_create

        first_seen: dict[str, tuple[datetime, datetime]] = {}
        for span in spans:
            if span.conversation_key in missing:
                seen = first_seen.get(span.conversation_key, (span.start_time, span.end_time))
                first_seen[span.conversation_key] = (min(seen[0], span.start_time), max(seen[1], span.end_time))
        project = Project.objects.get(pk=project_id)
        conversation_by_key.update(conversations_get_or_create(project=project, first_seen=first_seen))
        counts["conversations_created"] += len(missing)
    conversation_by_call = dict(
        ToolExecution.objects.filter(
            project_id=project_id, tool_call_id__in={s.tool_call_id for s in spans if s.tool_call_id}
        ).values_list("tool_call_id", "conversation_id")
    )
    traces = {span.trace_id for span in spans}
    conversation_by_trace = dict(
        Span.objects.filter(project_id=project_id, trace_id__in=traces, conversation__isnull=False)
        .values_list("trace_id", "conversation_id")
    )
    for trace_id, conversation_id in Round.objects.filter(
        project_id=project_id, trace_id__in=traces
    ).values_list("trace_id", "conversation_id"):
        conversation_by_trace.setdefault(trace_id, conversation_id)
    for span in spans:
        conversation_id = (
            conversation_by_key.get(span.conversation_key)
            or conversation_by_call.get(span.tool_call_id)
        )
        if conversation_id is not None:
            conversation_by_trace.setdefault(span.trace_id, conversation_id)
    changed = []
    for span in spans:
        conversation_id = (
            conversation_by_key.get(span.conversation_key)
            or conversation_by_call.get(span.tool_call_id)
            or conversation_by_trace.get(span.trace_id)
        )
        if conversation_id is not None:
            span.conversation_id = conversation_id
            changed.append(span)
    update_rows(Span, changed, ["conversation", "conversation_key"])
    trace_conversations_record(  # for the plain spans still to come
        project_id=project_id, links=((span.trace_id, span.conversation_id, span.start_time) for span in changed))
    counts["spans"] += len(changed)
    gained.update(span.conversation_id for span in changed)
    linked_traces.update(span.trace_id for span in changed)


def _artifacts_link(project_id: int, unlinked_artifacts: Any, counts: dict[str, Any]) -> None:
    """Artifacts -> the tool execution that names them, and its conversation."""
    artifacts = list(unlinked_artifacts.only("id", "artifact_id"))
    if not artifacts:
        return
    named = {
        row[0]: (row[1], row[2])
        for row in ToolExecution.objects.filter(
            project_id=project_id, artifact_id__in={a.artifact_id for a in artifacts}
        ).exclude(artifact_id="")  # implies the partial index's condition
        .order_by("occurred_at").values_list("artifact_id", "id", "conversation_id")
    }
    changed = []
    for artifact in artifacts:
        if artifact.artifact_id in named:
            artifact.tool_execution_id, artifact.conversation_id = named[artifact.artifact_id]
            changed.append(artifact)
    update_rows(Artifact, changed, ["tool_execution", "conversation"])
    counts["artifacts"] += len(changed)


def _spans_by_calls_or_traces(spans: Any, calls: set[str], traces: set[str]) -> list[Any]:
    """Queries for the spans with one of these tool call ids, and for those in one
    of these traces (a span may be in both; callers merge by id).

    Two queries rather than one with OR, so that each is an index lookup on any
    planner: the tool call one repeats the partial index's condition
    (tool_call_id <> ''), which a planner cannot infer from a long IN list; the
    trace one leads the unique (project, trace_id, span_id) index.
    """
    calls = {call for call in calls if call}
    traces = {trace for trace in traces if trace}
    queries = []
    if calls:
        queries.append(spans.filter(tool_call_id__in=calls).exclude(tool_call_id=""))
    if traces:
        queries.append(spans.filter(trace_id__in=traces))
    return queries


def _conversation_key(attributes: Any) -> str:
    if not isinstance(attributes, dict):
        return ""
    value = conventions.value_of("conversation", attributes)
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
        return str(value).strip()[:200]
    return ""


def traces_link(*, project_id: int, trace_ids: Iterable[str], linked_traces: set[str] | None = None) -> list[int]:
    """Link the unlinked spans of these traces to the conversation another span of
    the trace (or a round record of it) belongs to: the late-span pass, run from the
    outbox after each batch that stored unlinked spans or linked a trace. Only index
    lookups on (project, trace_id), and first only for the traces that have a span
    waiting (usually none: a batch links its own traces at ingest), so a pass of
    thousands of noted traces reads no more than that. Returns the conversations
    that gained spans (the note names those its batch linked at ingest itself), and
    adds the traces whose spans it linked to ``linked_traces`` when given."""
    traces = sorted({trace for trace in trace_ids if trace})
    touched: set[int] = set()
    for start in range(0, len(traces), 500):
        chunk = traces[start:start + 500]
        waiting = sorted(set(
            Span.objects.filter(project_id=project_id, trace_id__in=chunk, conversation__isnull=True)
            .values_list("trace_id", flat=True).distinct()
        ))
        if not waiting:
            continue
        by_trace: dict[str, int] = {}
        for trace_id, conversation_id in (
            Span.objects.filter(project_id=project_id, trace_id__in=waiting, conversation__isnull=False)
            .order_by("start_time").values_list("trace_id", "conversation_id")
        ):
            by_trace.setdefault(trace_id, conversation_id)
        for trace_id, conversation_id in Round.objects.filter(
            project_id=project_id, trace_id__in=waiting
        ).values_list("trace_id", "conversation_id"):
            by_trace.setdefault(trace_id, conversation_id)
        recorded: list[tuple[str, int, datetime]] = []
        for trace_id in waiting:  # one UPDATE per trace that has unlinked spans and a conversation
            conversation_id = by_trace.get(trace_id)
            if conversation_id is not None and Span.objects.filter(
                project_id=project_id, trace_id=trace_id, conversation__isnull=True
            ).update(conversation_id=conversation_id):
                touched.add(conversation_id)
                recorded.append((trace_id, conversation_id, timezone.now()))
                if linked_traces is not None:
                    linked_traces.add(trace_id)
        trace_conversations_record(project_id=project_id, links=recorded)  # (a round's trace may have none yet)
    return sorted(touched)


# --- log records ----------------------------------------------------------------------

def log_records_link(*, project_id: int, conversation_ids: Iterable[int] | None = None,
                     since: datetime | None = None) -> int:
    """Give the log records that still have no conversation the conversation of
    their span (by trace_id + span_id), else of another span of their trace.

    With ``conversation_ids`` (after a batch linked spans to them) only records of
    those conversations' traces; without (the beat's pass) the records received
    since ``since`` (default LINK_WINDOW), at most BEAT_SPAN_LIMIT. Only links are
    added, so running it again changes nothing. Returns the records linked.
    """
    from .models import LogRecord

    waiting = LogRecord.objects.filter(
        project_id=project_id, conversation__isnull=True, received_at__gte=since or timezone.now() - LINK_WINDOW
    ).exclude(trace_id="")
    if conversation_ids is not None:
        # The database tests each waiting record's trace (span_unique), so the cost
        # follows the records waiting, not the conversations' spans (millions).
        ids = sorted(set(conversation_ids))
        if not ids:
            return 0
        waiting = waiting.filter(Exists(Span.objects.filter(
            project_id=project_id, trace_id=OuterRef("trace_id"), conversation_id__in=ids)))
    rows = list(waiting.values_list("id", "trace_id", "span_id")[:BEAT_SPAN_LIMIT])
    if not rows:
        return 0
    by_span: dict[tuple[str, str], int] = {}
    by_trace: dict[str, int] = {}
    for trace_id, span_id, conversation_id in Span.objects.filter(
        project_id=project_id, trace_id__in=sorted({row[1] for row in rows}), conversation__isnull=False
    ).values_list("trace_id", "span_id", "conversation_id"):
        by_span[(trace_id, span_id)] = conversation_id
        by_trace.setdefault(trace_id, conversation_id)
    ids_by_conversation: dict[int, list[int]] = defaultdict(list)
    for pk, trace_id, span_id in rows:
        conversation_id = by_span.get((trace_id, span_id)) or by_trace.get(trace_id)
        if conversation_id is not None:
            ids_by_conversation[conversation_id].append(pk)
    linked = 0
    for conversation_id, ids in ids_by_conversation.items():
        linked += LogRecord.objects.filter(id__in=ids, conversation__isnull=True).update(conversation_id=conversation_id)
    return linked
