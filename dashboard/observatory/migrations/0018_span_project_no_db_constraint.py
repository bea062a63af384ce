"""Span.project without a database foreign key on PostgreSQL: the constraint was
checked for every span inserted (a deferred trigger per row, run at commit), a
fifth of the database's CPU when storing 10-span batches (deploy/SCALING.md).
Spans are only written for the project of a key just checked, and a project's
deletion deletes them (Django's cascade), as before. SQLite keeps its table as it
is (rebuilding it to drop the constraint would copy every span; SQLite checks it
with one lookup of the project's primary key a row)."""

from django.db import migrations, models
import django.db.models.deletion


def _constraint(cursor) -> str | None:
    cursor.execute(
        "SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = 'observatory_span'::regclass "
        "AND confrelid = 'accounts_project'::regclass"
    )
    row = cursor.fetchone()
    return row[0] if row else None


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        name = _constraint(cursor)
        if name:
            cursor.execute(f'ALTER TABLE observatory_span DROP CONSTRAINT "{name}"')


def add_back(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        if _constraint(cursor) is None:
            cursor.execute(
                "ALTER TABLE observatory_span ADD CONSTRAINT observatory_span_project_id_fk_accounts_project_id "
                "FOREIGN KEY (project_id) REFERENCES accounts_project (id) DEFERRABLE INITIALLY DEFERRED"
            )


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_login_throttle'),
        ('observatory', '0017_trace_conversations'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='span',
                    name='project',
                    field=models.ForeignKey(db_constraint=False, db_index=False,
                                            on_delete=django.db.models.deletion.CASCADE,
                                            related_name='spans', to='accounts.project'),
                ),
            ],
            database_operations=[migrations.RunPython(drop, add_back)],
        ),
    ]
