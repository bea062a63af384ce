"""Spans partitioned by day on PostgreSQL (observatory.partitions says why and how
they are kept). SQLite: only the state change below (no table is touched).

On PostgreSQL, in the migration's one transaction (the old table locked throughout,
so stop ingest or let exporters retry on the 503s; deploy/SCALING.md):
1. read the table's indexes and foreign keys, drop the one foreign key TO spans
   (ToolExecution.linked_span: a partitioned table can have no unique ``id`` for it
   to reference);
2. rename the table away, create ``observatory_span`` partitioned by range on
   start_time with the same columns (and its identity column), a default partition
   and one partition per UTC day from the longest span retention ago to 7 days
   ahead;
3. copy every row (a row outside those days goes to the default partition; the
   retention purge takes the expired ones), carry the id sequence over, drop the
   old table;
4. recreate the primary key as (id, start_time), the retry key as (project_id,
   trace_id, span_id, start_time), every other index and foreign key as they were.
Reversible: the reverse copies back into a plain table (one row per retry key).
"""

from datetime import datetime, time, timedelta, timezone

from django.conf import settings
from django.db import migrations, models
import django.db.models.deletion

TABLE = "observatory_span"
OLD = "observatory_span__old"
DAYS_AHEAD = 7


def _longest_span_days(apps) -> int:
    Project = apps.get_model("accounts", "Project")
    RetentionPolicy = apps.get_model("tuning", "RetentionPolicy")
    days = list(RetentionPolicy.objects.values_list("span_days", flat=True))
    if not days or Project.objects.exclude(pk__in=RetentionPolicy.objects.values("project_id")).exists():
        days.append(settings.OBSERVATORY_RETENTION_SPAN_DAYS)
    return max(days)


def _relkind(cursor, name):
    cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [name])
    row = cursor.fetchone()
    return row[0] if row else None


def _rebuild(cursor, *, partitioned: bool, days: list) -> None:
    cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    cursor.execute(
        "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass",
        [TABLE],
    )
    constraints = cursor.fetchall()
    cursor.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s",
        [TABLE],
    )
    backing = {name for name, kind, _ in constraints if kind in ("p", "u")}
    # A partitioned parent's index reads "ON ONLY <table>": the new one is built whole.
    indexes = [sql.replace(" ON ONLY ", " ON ") for name, sql in cursor.fetchall() if name not in backing]
    foreign = [(name, sql) for name, kind, sql in constraints if kind == "f"]
    cursor.execute(
        "SELECT conname, conrelid::regclass::text FROM pg_constraint WHERE confrelid = %s::regclass AND contype = 'f'",
        [TABLE],
    )
    for name, table in cursor.fetchall():
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [TABLE])
    cursor.execute(f"SELECT last_value, is_called FROM {cursor.fetchone()[0]}")
    sequence = cursor.fetchone()

    cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {OLD}")
    how = " PARTITION BY RANGE (start_time)" if partitioned else ""
    cursor.execute(f"CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING STORAGE){how}")
    if partitioned:
        cursor.execute(f"CREATE TABLE {TABLE}_default PARTITION OF {TABLE} DEFAULT")
        for day in days:
            low = datetime.combine(day, time.min, tzinfo=timezone.utc)
            cursor.execute(
                f"CREATE TABLE {TABLE}_p{day:%Y%m%d} PARTITION OF {TABLE} FOR VALUES FROM (%s) TO (%s)",
                [low, low + timedelta(days=1)],
            )
        cursor.execute(f"INSERT INTO {TABLE} SELECT * FROM {OLD}")
    else:
        # Back to one row per (project, trace, span): keep the first stored.
        cursor.execute(f"INSERT INTO {TABLE} SELECT DISTINCT ON (project_id, trace_id, span_id) * FROM {OLD} "
                       "ORDER BY project_id, trace_id, span_id, id")
    cursor.execute(f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), %s, %s)", list(sequence))
    cursor.execute(f"DROP TABLE {OLD}")
    cursor.execute(f"ALTER SEQUENCE IF EXISTS {TABLE}_id_seq1 RENAME TO {TABLE}_id_seq")

    key = ", start_time" if partitioned else ""
    cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id{key})")
    cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT span_unique UNIQUE (project_id, trace_id, span_id{key})")
    for sql in indexes:
        cursor.execute(sql)
    for name, sql in foreign:
        cursor.execute(f'ALTER TABLE {TABLE} ADD CONSTRAINT "{name}" {sql}')
    cursor.execute(f"ANALYZE {TABLE}")


def partition(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        if _relkind(cursor, TABLE) == "p":
            return
        today = datetime.now(timezone.utc).date()
        first = today - timedelta(days=_longest_span_days(apps))
        days = [first + timedelta(days=n) for n in range((today - first).days + DAYS_AHEAD + 1)]
        _rebuild(cursor, partitioned=True, days=days)


def unpartition(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        if _relkind(cursor, TABLE) != "p":
            return
        _rebuild(cursor, partitioned=False, days=[])
        # The link's foreign key again (its spans may have gone with a dropped day).
        cursor.execute("UPDATE observatory_toolexecution t SET linked_span_id = NULL WHERE linked_span_id IS NOT NULL "
                       f"AND NOT EXISTS (SELECT 1 FROM {TABLE} s WHERE s.id = t.linked_span_id)")
        cursor.execute(
            "ALTER TABLE observatory_toolexecution ADD CONSTRAINT observatory_toolexecution_linked_span_fk "
            f"FOREIGN KEY (linked_span_id) REFERENCES {TABLE} (id) DEFERRABLE INITIALLY DEFERRED"
        )


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0002_login_throttle"),
        ("tuning", "0001_initial"),
        ("observatory", "0007_spans_conventions"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # No database foreign key to a span on either backend's state; SQLite's
            # stays in its table until that table is next rebuilt (harmless: Django
            # clears the links before it deletes spans there).
            state_operations=[
                migrations.AlterField(
                    model_name="toolexecution",
                    name="linked_span",
                    field=models.ForeignKey(
                        blank=True, db_constraint=False, db_index=False, null=True,
                        on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="observatory.span",
                    ),
                ),
            ],
        ),
        migrations.RunPython(partition, unpartition),
    ]
