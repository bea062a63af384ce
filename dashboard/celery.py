"""The Celery app. Settings come from Django's (CELERY_* names); tasks are found in
each app's tasks.py. With no CELERY_BROKER_URL tasks run eagerly in-process."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
