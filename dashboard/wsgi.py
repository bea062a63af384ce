"""WSGI entry point (gunicorn dashboard.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
application = get_wsgi_application()

# The embedded mode's derivation thread starts with the worker, so notes a killed
# process left in the outbox are derived even before the next request. Under
# gunicorn with preload_app the module is imported in the master, and the thread
# is started in each worker after the fork instead (deploy/gunicorn.conf.py).
from dashboard.observatory.derive.runner import start_background  # noqa: E402

if os.environ.get("OBSERVATORY_BACKGROUND_AFTER_FORK") != "1":
    start_background()
