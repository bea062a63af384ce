"""Create a project: ``manage.py createproject "Sales agent" --member alice``."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboard.accounts.models import Membership
from dashboard.accounts.services import membership_add, project_create


class Command(BaseCommand):
    help = "Create a project, optionally with members (the first one becomes its owner)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--slug", default="")
        parser.add_argument("--member", action="append", default=[], help="username; repeatable")

    def handle(self, *args, name, slug, member, **options):
        User = get_user_model()
        users = []
        for username in member:
            user = User.objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"no user named {username!r} (create it with createuser)")
            users.append(user)
        try:
            project = project_create(name=name, slug=slug, owner=users[0] if users else None)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for user in users[1:]:
            membership_add(project=project, user=user, role=Membership.Role.MEMBER)
        self.stdout.write(f"created project {project.name} (slug {project.slug})")
