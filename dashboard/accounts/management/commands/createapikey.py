"""Create an API key for a project and print it once: ``manage.py createapikey my-project --name ci``.

Only the key's hash is stored; the printed text cannot be shown again."""

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from dashboard.accounts.models import Project
from dashboard.accounts.services import apikey_create


class Command(BaseCommand):
    help = "Create an API key for a project (by slug or name) and print it once."

    def add_arguments(self, parser):
        parser.add_argument("project", help="project slug or name")
        parser.add_argument("--name", default="default", help="a label for the key")

    def handle(self, *args, project, name, **options):
        found = list(Project.objects.filter(Q(slug=project) | Q(name=project))[:2])
        if not found:
            raise CommandError(f"no project {project!r}")
        if len(found) > 1:
            raise CommandError(f"several projects are named {project!r}; use the slug")
        key, plaintext = apikey_create(project=found[0], name=name)
        self.stderr.write(f"API key {key.name!r} for {found[0].slug} (shown once, store it now):")
        self.stdout.write(plaintext)
