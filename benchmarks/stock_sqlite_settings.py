"""The dashboard's settings with Django's own SQLite backend: writers wait in SQLite's
busy handler (``busy_timeout``) instead of the kernel queue of ``dashboard.sqlite``.
For side-by-side runs only (``bench_ingest --sqlite-engine stock``)."""

from dashboard.settings import *  # noqa: F401,F403
from dashboard.settings import DATABASES

if DATABASES["default"]["ENGINE"] == "dashboard.sqlite":
    DATABASES["default"]["ENGINE"] = "django.db.backends.sqlite3"
