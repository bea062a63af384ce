"""Delete data past retention: ``manage.py purge`` (all projects) or ``--project SLUG``.

The embedded default has no Celery beat; run this daily from cron instead."""

from django.core.management.base import BaseCommand, CommandError

from dashboard.accounts.models import Project
from dashboard.observatory.partitions import spans_partitions_drop
from dashboard.observatory.services import retention_purge


class Command(BaseCommand):
    help = "Delete spans, records, conversations and artifacts older than each project's retention."

    def add_arguments(self, parser):
        parser.add_argument("--project", help="only this project (slug)")

    def handle(self, *args, project, **options):
        projects = Project.objects.all()
        if project:
            projects = projects.filter(slug=project)
            if not projects.exists():
                raise CommandError(f"no project {project!r}")
        if not project:
            # PostgreSQL: the span days past every project's retention, dropped whole.
            dropped = spans_partitions_drop()
            self.stdout.write(f"{len(dropped)} span partitions dropped")
        for item in projects:
            outcome = retention_purge(project=item)
            self.stdout.write(
                f"{item.slug}: {outcome.spans} spans, {outcome.records} records, "
                f"{outcome.conversations} conversations, {outcome.artifacts} artifacts deleted"
            )
