"""The Pipeline Observatory dashboard: a Django project that ingests what agents send
(records, artifacts, OTLP spans) and shows it.

The Celery app is imported here so ``@shared_task`` binds to it whenever Django starts.
"""

from .celery import app as celery_app

__all__ = ["celery_app"]
