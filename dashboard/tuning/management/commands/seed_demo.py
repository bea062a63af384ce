"""What ``deploy/demo.sh`` sets up beside the demo's conversations:
``manage.py seed_demo demo`` (a project slug). See ``services.demo_setup``."""

from django.core.management.base import BaseCommand, CommandError

from dashboard.accounts.models import Project
from dashboard.tuning.services import demo_setup


class Command(BaseCommand):
    help = ("A price for the demo model, and a compression profile and a tool output policy fitted to its "
            "window when the project has none. Safe to run again.")

    def add_arguments(self, parser):
        parser.add_argument("project", help="the project's slug")

    def handle(self, *args, project, **options):
        found = Project.objects.filter(slug=project).first()
        if found is None:
            raise CommandError(f"no project with the slug {project!r} (create it with createproject)")
        for line in demo_setup(project=found):
            self.stdout.write(line)
