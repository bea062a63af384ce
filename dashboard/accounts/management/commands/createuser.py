"""Create (or update the password of) a user without prompts:
``manage.py createuser alice --password-env ALICE_PASSWORD [--superuser]``."""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Create a user non-interactively (password from --password or an environment variable)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--email", default="")
        parser.add_argument("--password", help="the password (visible in the process list: prefer --password-env)")
        parser.add_argument("--password-env", default="OBSERVATORY_PASSWORD",
                            help="environment variable holding the password (default OBSERVATORY_PASSWORD)")
        parser.add_argument("--superuser", action="store_true", help="make the user staff and superuser")

    def handle(self, *args, username, email, password, password_env, superuser, **options):
        password = password or os.environ.get(password_env, "")
        if not password:
            raise CommandError(f"no password: pass --password or set {password_env}")
        User = get_user_model()
        user, created = User.objects.get_or_create(username=username, defaults={"email": email})
        user.set_password(password)
        if email:
            user.email = email
        if superuser:
            user.is_staff = user.is_superuser = True
        user.save()
        self.stdout.write(f"{'created' if created else 'updated'} user {username}")
