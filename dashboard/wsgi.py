"""WSGI entry point (gunicorn dashboard.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
application = get_wsgi_application()

# The embedded mode's derivation thread starts with the worker, so notes a killed
# process left in the outbox are derived even before the next request.
from dashboard.observatory.dispatch import start_background  # noqa: E402

start_background()
