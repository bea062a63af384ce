"""ASGI entry point of the OTLP/HTTP receiver (4318): ``dashboard.receiver_asgi:application``,
served by Granian or uvicorn (``manage.py otlp_http``; see dashboard.ingest.receiver_app)."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django.setup()

from dashboard.ingest.receiver_app import ReceiverApp, allow_blocking_database  # noqa: E402

allow_blocking_database()
application = ReceiverApp()
