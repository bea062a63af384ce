"""Tool rollups by the minute: an hour's rollup becomes the sum of its minute
slices, and a batch recomputes only the minutes its rows fall in.

The hours rolled up before have no slices yet: each gets a note to recompute it
whole (which writes its slices), drained like any other. Until then its rollup
stays as it was; a minute recomputed meanwhile sums the hour from the slices
there are, and the hour's note, drained after, puts the rest back.
"""

import dashboard.observatory.histogram
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


HOURS_PER_NOTE = 24


def hours_recompute(apps, schema_editor):
    rollups = apps.get_model("observatory", "ToolHourlyRollup")
    notes = apps.get_model("observatory", "DerivationNote")
    hours_by_project = {}
    for project_id, hour in rollups.objects.values_list("project_id", "hour").distinct().order_by("project_id", "hour"):
        hours_by_project.setdefault(project_id, []).append(hour.isoformat())
    notes.objects.bulk_create(
        notes(project_id=project_id, hours=hours[i:i + HOURS_PER_NOTE])
        for project_id, hours in hours_by_project.items()
        for i in range(0, len(hours), HOURS_PER_NOTE)
    )


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_login_throttle'),
        ('observatory', '0014_span_tool_underived'),
    ]

    operations = [
        migrations.AddField(
            model_name='derivationnote',
            name='minutes',
            field=models.JSONField(default=list),
        ),
        migrations.CreateModel(
            name='ToolMinuteRollup',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tool_name', models.CharField(max_length=200)),
                ('calls', models.PositiveIntegerField(default=0)),
                ('successes', models.PositiveIntegerField(default=0)),
                ('errors', models.PositiveIntegerField(default=0)),
                ('retries', models.PositiveIntegerField(default=0)),
                ('timeouts', models.PositiveIntegerField(default=0)),
                ('cache_hits', models.PositiveIntegerField(default=0)),
                ('duration_sum_ms', models.FloatField(default=0.0)),
                ('latency_histogram', models.JSONField(default=dashboard.observatory.histogram.empty_histogram)),
                ('brief_tokens', models.BigIntegerField(default=0)),
                ('brief_count', models.PositiveIntegerField(default=0)),
                ('standard_tokens', models.BigIntegerField(default=0)),
                ('standard_count', models.PositiveIntegerField(default=0)),
                ('full_tokens', models.BigIntegerField(default=0)),
                ('full_count', models.PositiveIntegerField(default=0)),
                ('error_types', models.JSONField(default=dict)),
                ('cost_pico_usd', models.BigIntegerField(default=0)),
                ('priced_calls', models.PositiveIntegerField(default=0)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('minute', models.DateTimeField()),
                ('project', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='tool_minute_rollups', to='accounts.project')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('project', 'minute', 'tool_name'), name='minute_rollup_unique')],
            },
        ),
        migrations.RunPython(hours_recompute, migrations.RunPython.noop),
    ]
