"""Reading many rows a page at a time, in the order of an indexed column."""

from __future__ import annotations

import functools
import json
from collections import namedtuple
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any, Callable, Iterator, Optional, Sequence

from django.core.exceptions import EmptyResultSet
from django.db.models import JSONField, Q
from django.db.models.expressions import Col


def keyset_pages(query: Any, order: str, fields: Sequence[str], size: int) -> Iterator[list[tuple]]:
    """The rows of ``query`` as tuples of ``fields``, at most ``size`` a list, walked in
    (``order``, id) order past the last row read.

    Memory is bounded by ``size`` whatever the query holds (a list of every id first
    grew a worker by 60 MB when the beat's link pass found the hour's 900,000 records
    unlinked), each page is one query an index on ``order`` serves, and a row that drops
    out of the query after it was read (linked meanwhile) skips nothing, where an offset
    would skip the rows after it."""
    after = None
    while True:
        # The bare ``>=`` states the index's range start outright (a planner may not
        # draw it from the OR, and would read each page from the query's own start).
        page = query if after is None else query.filter(**{f"{order}__gte": after[0]}).filter(
            Q(**{f"{order}__gt": after[0]}) | Q(**{order: after[0], "id__gt": after[1]}))
        rows = values_read(page.order_by(order, "id").values_list(*fields, order, "id")[:size])
        if rows:
            yield [row[:len(fields)] for row in rows]
        if len(rows) < size:
            return
        after = rows[-1][-2:]


def values_read(query: Any, *, named: bool = False) -> list[tuple]:
    """The rows of a ``values_list`` query, as Django reads them, at a fraction of the
    cost: the query compiled by Django and run on its cursor, and each column converted
    once by its type (``_converter``) where Django calls a chain of converters a value
    (datetimes made aware through the settings, JSON through the field; on the
    derivations' reading of spans that was 9 % of the burst's CPU, bench_burst --profile).
    ``named``: as ``values_list(..., named=True)`` gives them."""
    if named:
        row = _row_type(tuple(query._fields))
        return [row._make(values) for values in values_read(query)]
    compiler = query.query.get_compiler(using=query.db)
    try:
        sql, params = compiler.as_sql()
    except EmptyResultSet:
        return []
    connection = compiler.connection
    converters = [_converter(expression, compiler) for expression, _, _ in compiler.select]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    convert = [(i, converter) for i, converter in enumerate(converters) if converter is not None]
    if not convert:
        return rows  # (the drivers' rows are tuples)
    converted = []
    for row in rows:
        values = list(row)
        for i, converter in convert:
            if values[i] is not None:
                values[i] = converter(values[i])
        converted.append(tuple(values))
    return converted


@functools.lru_cache(maxsize=64)
def _row_type(fields: tuple[str, ...]) -> Any:
    return namedtuple("Row", fields)


def _aware_utc(value: Any) -> Any:
    """SQLite's datetime column (a naive UTC datetime from the driver, or its text) made
    aware in UTC: what the backend's converter does for the database's UTC."""
    if not isinstance(value, datetime):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt_timezone.utc)


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value  # (as JSONField.from_db_value)


def _converter(expression: Any, compiler: Any) -> Optional[Callable[[Any], Any]]:
    """How a column of this expression becomes what Django's own reading gives: a
    plain function for datetimes and JSON, else Django's own converters chained
    (None: the value as the driver gives it)."""
    connection = compiler.connection
    field = expression.output_field
    kind = field.get_internal_type()
    if kind == "JSONField" and field.decoder is None and type(field).from_db_value is _JSON_FROM_DB:
        return _json
    if connection.vendor == "sqlite" and kind == "DateTimeField" and connection.timezone == dt_timezone.utc:
        return _aware_utc
    if connection.vendor == "sqlite" and kind == "BooleanField" and isinstance(expression, Col):
        return None  # the driver converts the column's declared type, "bool"
    found = compiler.get_converters([expression]).get(0)
    if not found:
        return None
    chain = found[0]

    def converted(value: Any) -> Any:
        for convert in chain:
            value = convert(value, expression, connection)
        return value
    return converted


_JSON_FROM_DB = JSONField.from_db_value
