"""Observation tokens may be unknown (null): a tool call known only from its span
whose span carries no whole result. The rollups count such calls apart
(``unknown_token_calls``) and leave them out of every token sum and cost; the
tokens of calls with no output level are summed apart (``unleveled_tokens``).

Tool executions derived from spans before this were never counted: their 0 was
"unknown". They become null, and the hours they fall in get a note so their rollups
are recomputed (drained like any other note).
"""

from datetime import timezone

from django.db import migrations, models
from django.db.models.functions import TruncHour

HOURS_PER_NOTE = 24


def span_counts_unknown(apps, schema_editor):
    executions = apps.get_model("observatory", "ToolExecution")
    notes = apps.get_model("observatory", "DerivationNote")
    uncounted = executions.objects.filter(source="span", observation_tokens=0)
    hours_by_project = {}
    for project_id, hour in (uncounted.annotate(hour=TruncHour("occurred_at", tzinfo=timezone.utc)).values_list("project_id", "hour")
                             .distinct().order_by("project_id", "hour")):
        hours_by_project.setdefault(project_id, []).append(hour.isoformat())
    uncounted.update(observation_tokens=None)
    notes.objects.bulk_create(
        notes(project_id=project_id, hours=hours[i:i + HOURS_PER_NOTE])
        for project_id, hours in hours_by_project.items()
        for i in range(0, len(hours), HOURS_PER_NOTE)
    )


class Migration(migrations.Migration):

    dependencies = [
        ('observatory', '0020_toolexec_conversation_round'),
    ]

    operations = [
        migrations.AddField(
            model_name='toolhourlyrollup',
            name='unknown_token_calls',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='toolminuterollup',
            name='unknown_token_calls',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='toolhourlyrollup',
            name='unleveled_tokens',
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='toolminuterollup',
            name='unleveled_tokens',
            field=models.BigIntegerField(default=0),
        ),
        migrations.AlterField(
            model_name='toolexecution',
            name='observation_tokens',
            field=models.PositiveIntegerField(blank=True, default=0, null=True),
        ),
        migrations.RunPython(span_counts_unknown, migrations.RunPython.noop),
    ]
