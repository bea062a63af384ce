"""The totals pass: each conversation's figures, recomputed from its rows.

Rounds, messages, tokens, context, errors, title, model, user, status, activity
times and cost of the batch's conversations; their tool calls, errors and retries
as sums of per-minute slices (ConversationMinute) of which only the minutes the
batch touched are recounted; each round's derived context, tool calls, errors and
cost; the hourly usage rollups of the hours the conversations' starts are in (and
left). Recomputed, never incremented, so running it twice gives the same rows.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, Callable, ContextManager, Iterable

from django.db import transaction
from django.db.models import Count, F, Max, Min, Model, OuterRef, Q, Subquery, Sum, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from dashboard.priority import yield_to_pages
from dashboard.observatory import costs
from dashboard.observatory.dbfunctions import MinuteUTC, database_now
from dashboard.observatory.models import (
    CompressionEvent,
    Conversation,
    ConversationMinute,
    Message,
    Round,
    SkillActivation,
    Span,
    ToolExecution,
    hour_of,
    minute_of,
)
from dashboard.observatory.paging import values_read
from dashboard.observatory.rows import update_rows, upsert_rows, values_joined

from ..batch import Batch, Pass, received_window
from ..notes import note_write


TITLE_LENGTH = 120


# --- conversation totals ------------------------------------------------------------

def _grouped(queryset: Any, **aggregates: Any) -> dict[int, dict[str, Any]]:
    return {
        row["conversation_id"]: row
        for row in queryset.values("conversation_id").order_by().annotate(**aggregates)
    }


def _title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"


@dataclass(frozen=True)
class Scope:
    """What a pass after batches brought to its conversations: the rows received in
    ``received`` (derived rows carry their span's received time) and the rounds of
    ``traces`` (spans linked late). Per-round figures (context, tool calls, cost) are
    derived again only for the rounds these rows are or belong to, so a long
    conversation costs what arrived, not its history; a conversation in ``whole`` (a
    note no ingest request wrote: a reprice, a re-sum, a late round assignment) has
    all its rounds derived again."""

    received: dict[str, datetime]
    traces: tuple[str, ...] = ()
    whole: frozenset[int] = frozenset()


def conversation_totals_refresh(*, conversation_ids: Iterable[int], minutes: Iterable[datetime] | None = None,
                                scope: Scope | None = None) -> int:
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

    With ``scope`` (a pass after batches) the per-round figures are derived for the
    rounds it names only; without, for every round of the conversations.
    """
    ids = sorted(set(conversation_ids))
    if not ids:
        return 0
    began = database_now()
    slices = _slices_read(ids, None if minutes is None else sorted({minute_of(m) for m in minutes}))
    conversations, round_updates, pricing = _conversation_totals_read(ids, slices, scope)
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
        # Round costs of a conversation a later pass wrote: that pass summed the costs
        # stored before these, so the conversation is summed again (a note).
        repriced = {r.conversation_id for r in pricing.rounds}
        pricing.rounds = [r for r in pricing.rounds if r.conversation_id in keep]
        pricing.save()  # [costs] round costs and the hourly usage rollups
        _resum_later({pk: current[pk]["project_id"] for pk in changed_slices | repriced
                      if pk in current and pk not in keep})
    return len(fresh)


# Fields a pass keeps as it read them when the rows say nothing new (no user message,
# no round with a model or user): another writer may set them meanwhile (the span-row
# pass sets a user from the naming spans), and the totals' write must not undo that.
_KEPT_UNLESS_DERIVED = ("title", "model", "user_id")
_SLICE_FIGURES = ("tool_calls", "tool_errors", "retries", "tool_model")
SLICE_RANGES = 50  # minute ranges one slice query reads (ORed)


def _conversation_totals_read(ids: list[int], slices: _SlicesRead, scope: Scope | None) -> tuple[
        list[Conversation], list[Any], Any]:
    """The conversations with their figures recomputed (but those of the tool calls:
    ``_slices_sum``), the rounds whose context changed, and their pricing: reads only."""
    conversations = list(Conversation.objects.filter(pk__in=ids).order_by("pk"))
    scoped = None if scope is None else _scoped_rounds(ids, {c.project_id for c in conversations}, scope)
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

    priced = None if scoped is None else {pk: set(pks) for pk, pks in scoped.items()}
    changed_model = [c.pk for c in conversations if priced is not None and c.pk in priced
                     and c.model != c.kept_as_read["model"]]
    if changed_model:  # the rounds naming no model are priced by the conversation's: again
        for pk, conversation_id in Round.objects.filter(conversation_id__in=changed_model, model="").values_list(
                "pk", "conversation_id"):
            priced[conversation_id].add(pk)
    pricing = costs.conversations_priced(conversations, only=priced)  # [costs] reads the old start hours
    with_rounds = [pk for pk in ids if rounds.get(pk, {}).get("n")]
    return conversations, _round_context(with_rounds, scoped), pricing


SCOPE_CHUNK = 500
SCOPE_IDS = 5_000  # conversations an IN list of the received rounds' query holds (one index probe each)


def _scoped_rounds(ids: list[int], projects: set[int], scope: Scope) -> dict[int, set[int]]:
    """Per conversation not in ``scope.whole``, the pks of its rounds the scope names
    and of the rounds its tool executions received in the window belong to (those
    through toolexec_project_received: never a conversation's history of calls).

    The linked traces and the window's tool executions are read once for all the
    conversations (kept when they are one of them): read per 500 conversations, a
    batch of 3,000 read them six times (bench_span_rows --conversations 3000)."""
    part = [pk for pk in ids if pk not in scope.whole]
    found: dict[int, set[int]] = {pk: set() for pk in part}
    named: set[tuple[int, str]] = set()
    traces = sorted(scope.traces)
    queries = [Round.objects.filter(conversation_id__in=part[i:i + SCOPE_IDS], **scope.received)
               for i in range(0, len(part), SCOPE_IDS)] + [
        Round.objects.filter(project_id__in=projects, trace_id__in=traces[i:i + SCOPE_CHUNK])
        for i in range(0, len(traces), SCOPE_CHUNK)] if part else []
    for query in queries:
        for pk, conversation_id, round_id in query.values_list("pk", "conversation_id", "round_id"):
            if conversation_id in found:
                found[conversation_id].add(pk)
                named.add((conversation_id, round_id))
    calls = {
        (conversation_id, round_id) for conversation_id, round_id in
        ToolExecution.objects.filter(project_id__in=projects, **scope.received).exclude(round_id="")
        .values_list("conversation_id", "round_id") if conversation_id in found
    } - named if part else set()
    # rounds of earlier batches that calls of this one belong to (records, mostly)
    ordered = sorted(calls)
    for i in range(0, len(ordered), SCOPE_CHUNK):
        some = ordered[i:i + SCOPE_CHUNK]
        for pk, conversation_id, round_id in Round.objects.filter(
            conversation_id__in={c for c, _ in some}, round_id__in={r for _, r in some}
        ).values_list("pk", "conversation_id", "round_id"):
            if (conversation_id, round_id) in calls:
                found[conversation_id].add(pk)
    return found


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
            rows.append(SimpleNamespace(conversation_id=pk, minute=minute, updated_at=began, **figures))
            if was is None or was[1:] != tuple(figures[name] for name in _SLICE_FIGURES):
                changed.add(pk)
    upsert_rows(ConversationMinute, rows, unique=["conversation", "minute"],
                field_names=["conversation", "minute", *_SLICE_FIGURES, "updated_at"])
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


def _round_context(conversation_ids: list[int], scoped: dict[int, set[int]] | None = None) -> list[Any]:
    """Per-round context size (reported, else the running sum of message tokens up
    to the round) and the round's tool calls and errors; only changed rounds (as
    rows for ``update_rows``).

    ``scoped``: per conversation, the pks of the only rounds to derive (a conversation
    not in it has all of them derived); their tool calls are counted through
    toolexec_conversation_round, and the running sum is read whole only for a
    conversation with a scoped round that reports no context."""
    scoped = {pk: pks for pk, pks in (scoped or {}).items() if pk in set(conversation_ids)}
    whole = [pk for pk in conversation_ids if pk not in scoped]
    fields = ("id", "conversation_id", "round_id", "index", "occurred_at", "context_tokens",
              "derived_context_tokens", "tool_call_count", "error_count")
    rounds = values_read(Round.objects.filter(conversation_id__in=whole).values_list(*fields), named=True) if whole else []
    tool_counts = _tool_counts(ToolExecution.objects.filter(conversation_id__in=whole)) if whole else {}
    pks = sorted(pk for some in scoped.values() for pk in some)
    for start in range(0, len(pks), SCOPE_CHUNK):
        some = values_read(Round.objects.filter(pk__in=pks[start:start + SCOPE_CHUNK]).values_list(*fields), named=True)
        rounds += some
        tool_counts.update(_rounds_tool_counts(sorted({(r.conversation_id, r.round_id) for r in some if r.round_id})))
    # the running sum of message tokens: every round of a conversation, up to the scoped ones
    summed = sorted({r.conversation_id for r in rounds if r.conversation_id in scoped and not r.context_tokens})
    if summed:
        rounds = [r for r in rounds if r.conversation_id not in set(summed)] + list(
            values_read(Round.objects.filter(conversation_id__in=summed).values_list(*fields), named=True))
    message_tokens: dict[tuple[int, str], int] = {
        (row["conversation_id"], row["round_id"]): row["tokens"] or 0
        for row in Message.objects.filter(conversation_id__in=whole + summed)
        .values("conversation_id", "round_id").order_by().annotate(tokens=Sum("tokens"))
    } if whole or summed else {}
    changed = []
    running: dict[int, int] = defaultdict(int)
    for round_ in sorted(rounds, key=lambda r: (r.conversation_id, r.index, r.occurred_at)):
        key = (round_.conversation_id, round_.round_id)
        running[round_.conversation_id] += message_tokens.get(key, 0)
        if round_.conversation_id in scoped and round_.id not in scoped[round_.conversation_id]:
            continue  # read for the running sum only
        derived = round_.context_tokens or running[round_.conversation_id]
        tools = tool_counts.get(key, {})
        values = (derived, tools.get("n", 0), tools.get("errors", 0))
        if values != (round_.derived_context_tokens, round_.tool_call_count, round_.error_count):
            changed.append(SimpleNamespace(pk=round_.id, conversation_id=round_.conversation_id,
                                           derived_context_tokens=derived, tool_call_count=values[1],
                                           error_count=values[2]))
    return changed


def _tool_counts(executions: Any) -> dict[tuple[int, str], dict[str, Any]]:
    return {
        (row["conversation_id"], row["round_id"]): row
        for row in executions.values("conversation_id", "round_id").order_by()
        .annotate(n=Count("id"), errors=Count("id", filter=Q(success=False)))
    }


def _rounds_tool_counts(rounds: list[tuple[int, str]]) -> dict[tuple[int, str], dict[str, Any]]:
    """``_tool_counts`` of these (conversation, round id) pairs, through the partial
    toolexec_conversation_round (an OR of a condition per conversation cost Django
    47 µs a span of bench_span_rows' first drain to compile)."""
    return {(conversation_id, round_id): {"conversation_id": conversation_id, "round_id": round_id,
                                          "n": n, "errors": errors or 0}
            for conversation_id, round_id, n, errors in values_joined(
                ToolExecution, rounds, on=[("conversation_id", "="), ("round_id", "=")],
                select="t.conversation_id, t.round_id, COUNT(*), SUM(CASE WHEN t.success THEN 0 ELSE 1 END)",
                # the partial index's own condition, word for word: SQLite's planner proves a
                # partial index usable only so (with "<> ''" it read each conversation's calls
                # through toolexec_conversation_time: 0.83-0.95x on bench_burst --conversations 50)
                where="NOT (t.round_id = '')", group_by="t.conversation_id, t.round_id")}


def run(batch: Batch) -> None:
    if batch.conversation_ids:
        received = received_window(batch.since, batch.until)
        conversation_totals_refresh(
            conversation_ids=batch.conversation_ids, minutes=batch.minutes,
            scope=None if received is None else Scope(received=received, traces=tuple(batch.linked_traces),
                                                      whole=frozenset(batch.whole)))


PASS = Pass(
    name="totals",
    reads=("Conversation", "Round", "Message", "ToolExecution", "CompressionEvent", "SkillActivation", "Span",
           "ConversationMinute", "PriceRule"),
    writes=("ConversationMinute", "Conversation (totals, title, model, user, status, times, cost)",
            "Round (derived context, tool calls, errors, cost)", "UsageHourlyRollup"),
    run=run,
)
