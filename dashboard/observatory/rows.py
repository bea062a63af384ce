"""Rows written in bulk, shared by ingest and the derivation passes: the
conversations of a batch got or created, INSERT … ON CONFLICT DO NOTHING without
the ORM's per-row cost, and UPDATE by primary key as one executemany. The lowest
layer of writes: it imports the models and nothing of ingest or the derivations."""

from __future__ import annotations

import json
import operator
import uuid
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any, Callable, Sequence

from django.db import IntegrityError, connections, models, router, transaction

from dashboard.accounts.models import Project

from .models import Conversation


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


def update_rows(model: type[models.Model], objs: Sequence[Any], field_names: list[str]) -> None:
    """UPDATE … WHERE id = %s for each object (a model instance, or any row with
    ``pk`` and the fields as attributes), as one executemany: what bulk_update does
    without building a CASE expression per field and row."""
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
    adapt = _adapting(fields, connection)
    params = [adapt([getattr(obj, f.attname) for f in fields]) + [obj.pk] for obj in objs]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def upsert_rows(model: type[models.Model], rows: Sequence[Any], unique: Sequence[str], field_names: Sequence[str]
                ) -> None:
    """INSERT … ON CONFLICT (``unique``) DO UPDATE SET the other ``field_names`` of
    each row (any object with the fields as attributes), as one executemany: what
    ``bulk_create(update_conflicts=True)`` does without a model instance a row and
    the compiling of SQLite's 999-parameter batches (the totals pass's slices: 15 µs
    a span of bench_span_rows' first drain, now ~2)."""
    if not rows:
        return
    connection = connections[router.db_for_write(model)]
    fields = [model._meta.get_field(name) for name in field_names]
    quote = connection.ops.quote_name
    keys = {model._meta.get_field(name).column for name in unique}
    columns = [f.column for f in fields]
    sql = "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO UPDATE SET {}".format(
        quote(model._meta.db_table), ", ".join(quote(c) for c in columns), ", ".join(["%s"] * len(columns)),
        ", ".join(quote(c) for c in columns if c in keys),
        ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in columns if c not in keys),
    )
    adapt = _adapting(fields, connection)
    with connection.cursor() as cursor:
        cursor.executemany(sql, [adapt([getattr(row, f.attname) for f in fields]) for row in rows])


def _adapting(fields: Sequence[models.Field], connection: Any) -> Callable[[list[Any]], list[Any]]:
    """A function that turns a list of values of ``fields`` into what the driver
    takes (``_adapter``), in place."""
    adapters = [(i, adapt) for i, field in enumerate(fields) if (adapt := _adapter(field, connection)) is not None]

    def adapted(values: list[Any]) -> list[Any]:
        for i, adapt in adapters:
            if values[i] is not None:
                values[i] = adapt(values[i])
        return values
    return adapted


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


JOIN_CHUNK = 500  # wanted tuples a VALUES list holds


def values_joined(model: type[models.Model], wanted: Sequence[Sequence[Any]], on: Sequence[tuple[str, str]],
                  select: str, where: str = "", group_by: str = "", params: Sequence[Any] = ()) -> list[tuple]:
    """Rows of ``model``'s table (alias ``t``) that match one of the ``wanted`` tuples:
    a VALUES list joined to the table, ``on`` pairing each position of a tuple with a
    column and a comparison (``("conversation_id", "="), ("index", ">=")``); ``select``,
    ``where`` (with ``params``) and ``group_by`` are SQL over ``t`` (a GROUP BY must keep a match's
    wanted tuple in one group: the list is read JOIN_CHUNK tuples a query).

    What a filter ORing one condition a tuple says, one index probe a tuple, without
    Django compiling the OR: for a batch of 500 conversations that compiling cost the
    passes more than the database's reading (bench_span_rows --phases)."""
    if not wanted:
        return []
    connection = connections[router.db_for_read(model)]
    quote = connection.ops.quote_name
    names = ", ".join(f"w{i}" for i in range(len(on)))
    condition = " AND ".join(f"t.{quote(column)} {compare} wanted.w{i}" for i, (column, compare) in enumerate(on))
    one = "(" + ", ".join(["%s"] * len(on)) + ")"
    found: list[tuple] = []
    with connection.cursor() as cursor:
        for start in range(0, len(wanted), JOIN_CHUNK):
            chunk = wanted[start:start + JOIN_CHUNK]
            cursor.execute(
                f"WITH wanted ({names}) AS (VALUES {', '.join([one] * len(chunk))}) SELECT {select} "
                f"FROM wanted JOIN {quote(model._meta.db_table)} t ON {condition}"
                + (f" WHERE {where}" if where else "") + (f" GROUP BY {group_by}" if group_by else ""),
                [value for row in chunk for value in row] + list(params),
            )
            found += cursor.fetchall()
    return found


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
    adapt = _adapting(fields, connection)
    values = [adapt(list(pick({**defaults, **row}))) for row in rows]
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
