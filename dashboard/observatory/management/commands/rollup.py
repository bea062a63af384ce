"""Recompute links, conversation totals and tool rollups for recent hours:
``manage.py rollup --hours 24`` (what the hourly beat does, over a longer reach;
useful after a bulk import)."""

from datetime import timedelta

from django.core.management.base import BaseCommand
from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.observatory.derive import schedule
from dashboard.observatory.derive.passes import rollups, totals


class Command(BaseCommand):
    help = "Recompute links, conversation totals and hourly tool rollups for the last N hours."

    def add_arguments(self, parser):
        parser.add_argument("--hours", type=int, default=3)

    def handle(self, *args, hours, **options):
        since = timezone.now() - timedelta(hours=max(hours, 1))
        for project in Project.objects.all():
            links = schedule.links_sweep(project.pk)
            conversation_ids = project.conversations.filter(last_activity_at__gte=since).values_list("pk", flat=True)
            totals.conversation_totals_refresh(conversation_ids=list(conversation_ids) + links["conversation_ids"])
            written = rollups.tool_rollups_refresh(
                project_id=project.pk, hours=rollups.hours_with_rows(project_id=project.pk, since=since)
            )
            self.stdout.write(f"{project.slug}: {written} rollups written")
