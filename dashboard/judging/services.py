"""Writes of scores: one store path for the API, the pages and OpenTelemetry events.

``scores_store`` takes validated ``pipeline.ScoreRecord``s and who sends them
(``Author``), checks each against its name's config (``rules.score_refusal``), and
in the caller's transaction stores the new ones, counts the ones already stored
unchanged (a retried score), and applies the changed ones as edits with their
history (``ScoreEdit``). A score id keeps what it scores: the same id naming another
target is refused, not moved. Each refusal is per score, with its position, like
the records API; the others are stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Sequence

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, Max, OuterRef, Q, QuerySet
from django.utils import timezone

from dashboard.accounts.models import ApiKey, Project
from dashboard.observatory.models import Conversation
from pipeline import DatasetError, ScoreRecord, parse_dataset_line
from pipeline import DatasetItem as DatasetRecord

from .links import CHUNK, targets_resolve
from .models import (
    Dataset,
    DatasetItem,
    EvaluationRefusal,
    ReviewItem,
    ReviewQueue,
    ReviewStatus,
    Score,
    ScoreConfig,
    ScoreEdit,
    ScoreHour,
    ScoreHourChanged,
    ScoreSource,
)
from .selectors import DatasetCase, hour_rows
from .rules import ConfigRules, is_negative, kind_of, score_refusal

ERROR_LENGTH = 300
# The fields an edit may change, and what ScoreEdit records of them.
EDITABLE = ("name", "kind", "value", "label", "comment", "negative", "occurred_at")


@dataclass(frozen=True, slots=True)
class Author:
    """Who sends scores: a member on a page, or an API key (the API, an OpenTelemetry
    exporter)."""

    source: str
    user: AbstractBaseUser | None = None
    key_id: int | None = None
    name: str = ""

    @classmethod
    def of_user(cls, user: AbstractBaseUser) -> Author:
        return cls(ScoreSource.UI, user=user, name=user.get_username()[:150])

    @classmethod
    def of_key(cls, key_id: int | None, source: str = ScoreSource.API) -> Author:
        key = ApiKey.objects.filter(pk=key_id).only("name", "prefix").first() if key_id else None
        return cls(source, key_id=key_id, name=f"key {key.name} (po_{key.prefix}_…)"[:150] if key else "")


@dataclass
class ScoresOutcome:
    accepted: int = 0  # new scores stored
    duplicates: int = 0  # already stored as sent (a retry)
    updated: int = 0  # stored before with other values: edited
    rejected: list[dict[str, Any]] = field(default_factory=list)  # {"index", "error"}
    scores: list[Score] = field(default_factory=list)  # the rows stored or edited


def configs_for(project: Project, names: set[str]) -> dict[str, ConfigRules]:
    """The configs of these score names in the project, as the checks read them."""
    found: dict[str, ConfigRules] = {}
    names_list = sorted(names)
    for start in range(0, len(names_list), CHUNK):
        for config in ScoreConfig.objects.filter(project=project, name__in=names_list[start:start + CHUNK]):
            found[config.name] = rules_of(config)
    return found


def rules_of(config: ScoreConfig) -> ConfigRules:
    return ConfigRules(config.name, config.kind, config.min_value, config.max_value,
                       tuple(config.labels), tuple(config.negative_labels))


def scores_store(*, project: Project, scores: Sequence[ScoreRecord], author: Author,
                 indexes: Sequence[int] | None = None) -> ScoresOutcome:
    """Store a batch of scores in the caller's transaction (or one of its own).
    ``indexes`` are the scores' positions in what the sender sent (for refusals)."""
    positions = list(indexes) if indexes is not None else list(range(len(scores)))
    outcome = ScoresOutcome()
    if not scores:
        return outcome
    configs = configs_for(project, {score.name for score in scores})
    now = timezone.now()
    # score_id -> (position, row, whether the sender gave its time): the last one sent wins
    rows: dict[str, tuple[int, Score, bool]] = {}
    for position, record in zip(positions, scores):
        config = configs.get(record.name)
        refusal = score_refusal(config, record.value, record.label)
        if refusal is not None:
            outcome.rejected.append({"index": position, "error": refusal[:ERROR_LENGTH]})
            continue
        rows[record.score_id] = (position, _row(project, record, config, author, now),
                                 "occurred_at" in record.model_fields_set)
    with transaction.atomic():
        try:
            with transaction.atomic():
                _store_rows(project, rows, author, now, outcome)
        except IntegrityError:
            # A score id stored by a concurrent request since we looked: look again (once).
            outcome = ScoresOutcome(rejected=[r for r in outcome.rejected if r["index"] not in
                                              {position for position, _, _ in rows.values()}])
            _store_rows(project, rows, author, now, outcome)
    outcome.rejected.sort(key=lambda item: item["index"])
    return outcome


def _store_rows(project: Project, rows: dict[str, tuple[int, Score, bool]], author: Author, now: datetime,
                outcome: ScoresOutcome) -> None:
    stored = _stored(project, list(rows))
    new = []
    for score_id, (position, row, timed) in rows.items():
        old = stored.get(score_id)
        if old is None:
            new.append(row)
        elif _target(old) != _target(row):
            outcome.rejected.append({"index": position, "error": f"score_id {score_id[:80]!r} already scores "
                                     f"another {old.target}; send a new score_id"})
        else:
            if not timed:  # a retry of a score sent without its time is the same score
                row.occurred_at = old.occurred_at
            changes = _changes(old, row)
            if not changes:
                outcome.duplicates += 1
                continue
            _edit(old, changes, author, now)
            outcome.updated += 1
            outcome.scores.append(old)
    targets_resolve(project.pk, new)
    Score.objects.bulk_create(new)
    outcome.accepted += len(new)
    outcome.scores.extend(new)


def _row(project: Project, record: ScoreRecord, config: ConfigRules | None, author: Author, now: datetime) -> Score:
    kind = config.kind if config is not None else kind_of(record.value, record.label)
    value = None if record.value is None else float(record.value)
    label = record.label or ""
    return Score(
        project=project, score_id=record.score_id, name=record.name, kind=kind, value=value, label=label,
        comment=record.comment or "", negative=is_negative(config, kind, value, label), source=author.source,
        author_user=author.user, author_key_id=author.key_id, author_name=author.name,
        occurred_at=record.occurred_at, created_at=now, updated_at=now, target=record.target,
        conversation_key=record.conversation_id or "", round_key=record.round_id or "",
        tool_call_id=record.tool_call_id or "", trace_id=record.trace_id or "", span_id=record.span_id or "",
        response_id=record.response_id or "",
    )


def _target(score: Score) -> tuple[str, ...]:
    """What a score judges, as sent (a response's trace and span are found, not sent)."""
    span = () if score.target == "response" else (score.trace_id, score.span_id)
    return (score.target, score.conversation_key, score.round_key, score.tool_call_id, score.response_id, *span)


def _stored(project: Project, score_ids: list[str]) -> dict[str, Score]:
    found: dict[str, Score] = {}
    for start in range(0, len(score_ids), CHUNK):
        for score in Score.objects.filter(project=project, score_id__in=score_ids[start:start + CHUNK]):
            found[score.score_id] = score
    return found


def _changes(old: Score, new: Score) -> dict[str, list[Any]]:
    changes = {}
    for name in EDITABLE:
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            changes[name] = [before, after]
    return changes


def _edit(score: Score, changes: dict[str, list[Any]], author: Author, now: datetime) -> None:
    for name, (_, after) in changes.items():
        setattr(score, name, after)
    score.updated_at = now
    score.save(update_fields=[*changes, "updated_at"])
    ScoreEdit.objects.create(
        score=score, changed_at=now, by_user=author.user, by_key_id=author.key_id, by_name=author.name,
        source=author.source,
        changes={name: [_plain(before), _plain(after)] for name, (before, after) in changes.items()},
    )


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


class ScoreRefused(ValueError):
    """A score the pages' form could not store: the message says why, for the form."""


def score_from_page(*, project: Project, user: AbstractBaseUser, record: ScoreRecord) -> Score:
    """Store one score a member gave on a page (an edit when its id was stored)."""
    outcome = scores_store(project=project, scores=[record], author=Author.of_user(user))
    if outcome.rejected:
        raise ScoreRefused(outcome.rejected[0]["error"])
    if outcome.scores:
        return outcome.scores[0]
    return Score.objects.get(project=project, score_id=record.score_id)


def evaluation_refusals_count(*, project: Project, refusals: Sequence[tuple[str, str]]) -> None:
    """Count refused ``gen_ai.evaluation.result`` events, (score name, reason) each,
    per name with the last reason, in the caller's transaction."""
    by_name: dict[str, tuple[int, str]] = {}
    for name, reason in refusals:
        count, _ = by_name.get(name[:200], (0, ""))
        by_name[name[:200]] = (count + 1, reason[:ERROR_LENGTH])
    now = timezone.now()
    for name, (count, reason) in sorted(by_name.items()):
        rows = EvaluationRefusal.objects.filter(project=project, name=name)
        if rows.update(count=F("count") + count, last_reason=reason, last_at=now):
            continue
        try:
            with transaction.atomic():
                EvaluationRefusal.objects.create(project=project, name=name, count=count, last_reason=reason,
                                                 first_at=now, last_at=now)
        except IntegrityError:  # counted by a concurrent batch since we looked
            rows.update(count=F("count") + count, last_reason=reason, last_at=now)


def score_delete(*, score: Score) -> None:
    score.delete()


# --- review queues ----------------------------------------------------------------------

MAX_QUEUE_ITEMS = 10_000  # conversations one fill adds at most
CLAIM = timedelta(minutes=15)  # how long an item given to a reviewer stays theirs


class ReviewError(ValueError):
    """A queue action that cannot be done (the message says why)."""


def review_queue_create(*, project: Project, name: str, query: str, conversations: QuerySet[Conversation],
                        user: AbstractBaseUser, description: str = "", now: datetime | None = None) -> ReviewQueue:
    """A queue named ``name`` filled with ``conversations`` (the list's filtered
    rows, in its order, read as of ``now``), at most MAX_QUEUE_ITEMS of them."""
    try:
        with transaction.atomic():
            queue = ReviewQueue.objects.create(project=project, name=name, query=query, created_by=user,
                                               description=description)
            review_queue_fill(queue=queue, conversations=conversations, now=now)
    except IntegrityError:
        raise ReviewError(f"There is a queue named {name!r} already.") from None
    return queue


def review_queue_fill(*, queue: ReviewQueue, conversations: QuerySet[Conversation],
                      now: datetime | None = None) -> int:
    """Add the conversations not in the queue yet, after its last item, and note the
    fill's time (``now``: when the filters were read); returns how many."""
    with transaction.atomic():
        queue.filled_at = now or timezone.now()
        ReviewQueue.objects.filter(pk=queue.pk).update(filled_at=queue.filled_at)
        last = ReviewItem.objects.filter(queue=queue).aggregate(last=Max("position"))["last"]
        start = 0 if last is None else last + 1
        present = ReviewItem.objects.filter(queue=queue, conversation=OuterRef("pk"))
        ids = list(conversations.filter(project_id=queue.project_id).exclude(Exists(present))
                   .values_list("pk", flat=True)[:MAX_QUEUE_ITEMS])
        ReviewItem.objects.bulk_create(
            [ReviewItem(queue=queue, conversation_id=pk, position=start + i) for i, pk in enumerate(ids)])
    return len(ids)


def _claimable(now: datetime) -> Q:
    return Q(status=ReviewStatus.PENDING) & (Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))


def review_item_claim(*, queue: ReviewQueue, user: AbstractBaseUser) -> ReviewItem | None:
    """The item this reviewer should review now: the one they hold, else the first
    pending item no one holds, claimed for them (a conditional UPDATE: two reviewers
    asking at once never get the same item). None when the queue is done."""
    now = timezone.now()
    items = ReviewItem.objects.filter(queue=queue)
    held = items.filter(claimed_by=user, status=ReviewStatus.PENDING, claimed_until__gt=now).order_by("position")
    mine = held.first()
    if mine is not None:
        return mine
    for _ in range(20):  # another reviewer may take the candidate between the read and the update
        candidate = items.filter(_claimable(now)).order_by("position").values_list("pk", flat=True).first()
        if candidate is None:
            return None
        if items.filter(_claimable(now), pk=candidate).update(claimed_by=user, claimed_until=now + CLAIM):
            return items.get(pk=candidate)
    return None


def review_item_finish(*, item: ReviewItem, user: AbstractBaseUser, status: str) -> None:
    """Mark the item reviewed (or skipped) by ``user``, who must hold it (or find it
    free: a claim that ran out)."""
    if status not in (ReviewStatus.DONE, ReviewStatus.SKIPPED):
        raise ReviewError("Mark an item reviewed or skipped.")
    now = timezone.now()
    mine_or_free = Q(claimed_by=user) | Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    updated = ReviewItem.objects.filter(mine_or_free, pk=item.pk, status=ReviewStatus.PENDING).update(
        status=status, done_by=user, done_at=now, claimed_until=None)
    if not updated:
        raise ReviewError("Another reviewer holds this item, or it is reviewed already.")


def review_item_reopen(*, item: ReviewItem) -> None:
    ReviewItem.objects.filter(pk=item.pk).update(status=ReviewStatus.PENDING, done_by=None, done_at=None,
                                                 claimed_by=None, claimed_until=None)


# --- datasets ---------------------------------------------------------------------------

MAX_DATASET_ADD = 10_000  # rows one "add the whole list" takes at most


class DatasetRefused(ValueError):
    """A dataset action that cannot be done (the message says why)."""


class DatasetTooLarge(DatasetRefused):
    """More items than one request or upload may add."""


def dataset_lines_parse(body: bytes, *, limit: int) -> list[DatasetRecord]:
    """Every line of a JSONL text as a ``pipeline.DatasetItem``, all or nothing: the
    first bad line refuses them all, naming it. More than ``limit`` lines are refused
    before any is parsed."""
    if body.count(b"\n") > limit:
        raise DatasetTooLarge(f"too many items at once (at most {limit})")
    items = []
    for number, line in enumerate(body.split(b"\n"), start=1):
        try:
            item = parse_dataset_line(line, number)
        except DatasetError as exc:
            raise DatasetRefused(f"{str(exc)[:300]}; nothing was imported") from None
        except UnicodeDecodeError:
            raise DatasetRefused(f"line {number}: not UTF-8; nothing was imported") from None
        if item is not None:
            items.append(item)
    if not items:
        raise DatasetRefused("no items: one JSON item a line")
    if len(items) > limit:
        raise DatasetTooLarge(f"too many items at once (at most {limit})")
    return items


def dataset_create(*, project: Project, name: str, user: AbstractBaseUser | None, description: str = "") -> Dataset:
    try:
        with transaction.atomic():
            return Dataset.objects.create(project=project, name=name, description=description, created_by=user)
    except IntegrityError:
        raise DatasetRefused(f"There is a dataset named {name!r} already.") from None


def dataset_add_cases(*, dataset: Dataset, cases: Sequence[DatasetCase]) -> int:
    """Add production cases (``selectors.cases_of_rounds`` / ``cases_of_conversations``);
    one already in the dataset (by item id) is left as it is. Returns how many were added."""
    now = timezone.now()
    items = [DatasetItem(dataset=dataset, item_id=case.item_id, input=case.input, output=case.output,
                         source=case.source, source_conversation_id=case.conversation_id,
                         source_round_id=case.round_id, created_at=now, updated_at=now) for case in cases]
    return _items_insert(dataset, items)


def dataset_import(*, dataset: Dataset, items: Sequence[DatasetRecord]) -> tuple[int, int]:
    """Add imported items (validated ``pipeline.DatasetItem``s), all in one transaction;
    returns (added, already there by item id)."""
    now = timezone.now()
    rows = [DatasetItem(dataset=dataset, item_id=item.item_id, input=item.input, output=item.output,
                        expected_output=item.expected_output, source=item.source, metadata=item.metadata,
                        created_at=now, updated_at=now) for item in items]
    added = _items_insert(dataset, rows)
    return added, len({row.item_id for row in rows}) - added


def _items_insert(dataset: Dataset, rows: list[DatasetItem]) -> int:
    unique = list({row.item_id: row for row in rows}.values())
    with transaction.atomic():
        present: set[str] = set()
        ids = [row.item_id for row in unique]
        for start in range(0, len(ids), CHUNK):
            present.update(DatasetItem.objects.filter(dataset=dataset, item_id__in=ids[start:start + CHUNK])
                           .values_list("item_id", flat=True))
        new = [row for row in unique if row.item_id not in present]
        DatasetItem.objects.bulk_create(new, batch_size=500)
    return len(new)


def dataset_item_expect(*, item: DatasetItem, expected: Any) -> None:
    item.expected_output = expected
    item.updated_at = timezone.now()
    item.save(update_fields=["expected_output", "updated_at"])


def dataset_item_delete(*, item: DatasetItem) -> None:
    item.delete()


# --- the hourly figures of scores -----------------------------------------------------------


def score_hours_refresh(*, project: Project, since: datetime, until: datetime) -> int:
    """Recompute the ScoreHour rows of the hours in [since, until) whose scores changed
    (the database marked them: ScoreHourChanged), each whole from its rows, in one
    transaction; returns how many hours. A score written meanwhile marks its hour
    again, for the next refresh."""
    with transaction.atomic():
        changed = ScoreHourChanged.objects.filter(project=project, hour__gte=since, hour__lt=until)
        hours = sorted(set(changed.values_list("hour", flat=True)))
        if not hours:
            return 0
        changed.filter(hour__in=hours).delete()
        ScoreHour.objects.filter(project=project, hour__in=hours).delete()
        ScoreHour.objects.bulk_create([row for hour in hours for row in hour_rows(project.pk, hour)], batch_size=500)
    return len(hours)
