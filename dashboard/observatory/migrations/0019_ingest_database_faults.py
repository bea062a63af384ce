"""IngestDatabaseFault: the count of batches a broken database failed (500), per
project, transport and day, for the admin."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_login_throttle'),
        ('observatory', '0018_span_project_no_db_constraint'),
    ]

    operations = [
        migrations.CreateModel(
            name='IngestDatabaseFault',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateField()),
                ('transport', models.CharField(choices=[('otlp_http', 'OTLP/HTTP (web port)'), ('otlp_receiver', 'OTLP/HTTP receiver (4318)'), ('otlp_grpc', 'OTLP/gRPC'), ('records', 'records API'), ('artifacts', 'artifacts API'), ('api', 'other API')], max_length=16)),
                ('count', models.PositiveIntegerField(default=0)),
                ('last_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('last_error', models.CharField(blank=True, max_length=200)),
                ('project', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.project')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('project', 'day', 'transport'), name='ingest_fault_unique'), models.UniqueConstraint(condition=models.Q(('project__isnull', True)), fields=('day', 'transport'), name='ingest_fault_unique_no_project')],
            },
        ),
    ]
