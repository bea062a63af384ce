"""TraceConversation: the conversation of each trace with a linked span, which
ingest looks up instead of the spans (models.TraceConversation). Filled here from
the spans stored: one pass over the spans that have a conversation (on a large
PostgreSQL database, minutes: deploy/SCALING.md)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_login_throttle'),
        ('observatory', '0016_conversation_minutes'),
    ]

    operations = [  # the model, then its rows from the spans
        migrations.CreateModel(
            name='TraceConversation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('trace_id', models.CharField(max_length=32)),
                ('started_at', models.DateTimeField()),
                ('conversation', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='observatory.conversation')),
                ('project', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, to='accounts.project')),
            ],
            options={
                'indexes': [models.Index(fields=['started_at'], name='trace_conversation_started')],
                'constraints': [models.UniqueConstraint(fields=('project', 'trace_id'), name='trace_conversation_unique')],
            },
        ),
        migrations.RunSQL(
            sql=(
                "INSERT INTO observatory_traceconversation (project_id, trace_id, conversation_id, started_at) "
                "SELECT project_id, trace_id, MIN(conversation_id), MIN(start_time) FROM observatory_span "
                "WHERE conversation_id IS NOT NULL GROUP BY project_id, trace_id"
            ),
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
