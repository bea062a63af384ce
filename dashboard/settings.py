"""Django settings for the Pipeline Observatory dashboard.

Everything that differs between a laptop and production comes from the environment
through the helpers in ``dashboard.env``; a bad value stops the process at start.
With nothing set, the dashboard is a complete embedded product: SQLite (WAL) and
artifacts under ``./var``, Celery tasks run eagerly in-process.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery.schedules import crontab

from dashboard import env

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = env.env_dir("OBSERVATORY_DATA_DIR", str(BASE_DIR / "var"))

DEBUG = env.env_bool("DEBUG", False)
SECRET_KEY = env.secret_key(DATA_DIR, debug=DEBUG, testing=env.running_tests())
ALLOWED_HOSTS = env.env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "ninja",
    "dashboard.accounts",
    "dashboard.observatory",
    "dashboard.tuning",
    "dashboard.web",
    "dashboard.judging",
    "dashboard.metrics",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "dashboard.middleware.RejectNulBytesMiddleware",
    "dashboard.middleware.IngestFastPathMiddleware",  # agents' endpoints stop here
    "dashboard.priority.PagePriorityMiddleware",  # ingest steps aside while a page runs
    # Static files from the app itself, so gunicorn alone serves a complete dashboard.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "dashboard.web.middleware.SecurityHeadersMiddleware",
]

ROOT_URLCONF = "dashboard.urls"
WSGI_APPLICATION = "dashboard.wsgi.application"
ASGI_APPLICATION = "dashboard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.web.context_processors.projects",
            ],
        },
    },
]

DATABASES = {"default": env.database("DATABASE_URL", DATA_DIR)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
AUTHENTICATION_BACKENDS = ["dashboard.accounts.backends.ThrottledModelBackend"]
# Log-in throttling: this many failures within the window lock the account (or the
# client address) out for the window's length, the right password included.
OBSERVATORY_LOGIN_MAX_FAILURES_PER_ACCOUNT = env.env_int("OBSERVATORY_LOGIN_MAX_FAILURES_PER_ACCOUNT", 5, minimum=1)
OBSERVATORY_LOGIN_MAX_FAILURES_PER_ADDRESS = env.env_int("OBSERVATORY_LOGIN_MAX_FAILURES_PER_ADDRESS", 20, minimum=1)
OBSERVATORY_LOGIN_LOCKOUT_SECONDS = env.env_int("OBSERVATORY_LOGIN_LOCKOUT_SECONDS", 900, minimum=1)
# Behind a proxy every client has the proxy's REMOTE_ADDR: name the header it sets
# with the real address (e.g. X-Real-IP) so per-address throttling means something.
OBSERVATORY_CLIENT_IP_HEADER = env.env_str("OBSERVATORY_CLIENT_IP_HEADER", "")
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns on every request when it is missing
# Serve from the app's static folders too, so a run without collectstatic (the demo,
# tests) still has its css and js; deploy/run-web.sh collects them anyway.
WHITENOISE_USE_FINDERS = True

# Artifacts live in their own storage so they can move to object storage without
# code changes; the file system location is never shown to a client.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {
            "location": str(env.env_dir("OBSERVATORY_ARTIFACT_DIR", str(DATA_DIR / "artifacts"))),
            "base_url": None,
            "file_permissions_mode": 0o640,
            "directory_permissions_mode": 0o750,
        },
    },
}

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env.env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# HTTPS behind a proxy: off by default so plain-http local use (the demo) works.
SECURE_SSL_REDIRECT = env.env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env.env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env.env_bool("SECURE_HSTS_PRELOAD", False)
if env.env_bool("SECURE_PROXY_SSL_HEADER", False):
    # Trust X-Forwarded-Proto from the proxy (only set this behind one that strips it from clients).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Ingest limits (bytes, counts). The body limit is checked before reading; the
# decoded limit bounds gzip expansion.
OBSERVATORY_MAX_BODY_BYTES = env.env_int("OBSERVATORY_MAX_BODY_BYTES", 8 * 1024 * 1024, minimum=1024)
OBSERVATORY_MAX_DECODED_BYTES = env.env_int(
    "OBSERVATORY_MAX_DECODED_BYTES", 64 * 1024 * 1024, minimum=1024
)
# Seconds an ingest request may take to send its body (chunked or not); a sender
# that stalls mid-body gets 408 instead of holding a worker thread.
OBSERVATORY_BODY_READ_TIMEOUT = env.env_int("OBSERVATORY_BODY_READ_TIMEOUT", 20, minimum=1)
OBSERVATORY_MAX_ARTIFACT_BYTES = env.env_int(
    "OBSERVATORY_MAX_ARTIFACT_BYTES", 256 * 1024 * 1024, minimum=1
)
OBSERVATORY_MAX_RECORDS_PER_BATCH = env.env_int("OBSERVATORY_MAX_RECORDS_PER_BATCH", 5000, minimum=1)
# Scores one POST /api/v1/scores may carry; more is refused (413) before the body is parsed.
OBSERVATORY_MAX_SCORES_PER_BATCH = env.env_int("OBSERVATORY_MAX_SCORES_PER_BATCH", 1000, minimum=1)
# Concurrent ingest requests per process before answering 429 + Retry-After.
# Paths of the agents' endpoints (API key, no session): they skip the pages' middleware.
OBSERVATORY_INGEST_PATH_PREFIXES = ("/v1/", "/api/v1/records", "/api/v1/artifacts", "/api/v1/config",
                                    "/api/v1/scores", "/api/v1/datasets")
# Ingest requests a process serves at once: one thread fewer than gunicorn gives it
# (WEB_THREADS), so a page always finds a thread; past it ingest answers 429.
OBSERVATORY_MAX_CONCURRENT_INGEST = env.env_int(
    "OBSERVATORY_MAX_CONCURRENT_INGEST", max(1, env.env_int("WEB_THREADS", 4, minimum=1) - 1), minimum=1
)
# Bytes of decoded ingest data (bodies, parsed messages, rows) a process holds at
# once; a request that alone needs more is refused (413), one that finds it taken
# waits (503 + Retry-After). See dashboard.ingest.common.memory_reserve.
OBSERVATORY_INGEST_MEMORY_BYTES = env.env_int("OBSERVATORY_INGEST_MEMORY_BYTES", 128 * 1024 * 1024, minimum=1024 * 1024)
# OTLP/gRPC (manage.py otlp_grpc, its own process): where it listens, the threads
# that run exports (as many as the ingest gate lets in, so none waits on it) and the
# RPCs accepted at once (queued for a thread; gRPC refuses more).
OBSERVATORY_GRPC_HOST = env.env_str("OBSERVATORY_GRPC_HOST", "127.0.0.1")
OBSERVATORY_GRPC_PORT = env.env_int("OBSERVATORY_GRPC_PORT", 4317, minimum=0)
OBSERVATORY_GRPC_THREADS = env.env_int("OBSERVATORY_GRPC_THREADS", OBSERVATORY_MAX_CONCURRENT_INGEST, minimum=1)
OBSERVATORY_GRPC_MAX_CONCURRENT_RPCS = env.env_int("OBSERVATORY_GRPC_MAX_CONCURRENT_RPCS", 64, minimum=1)
OBSERVATORY_GRPC_REUSEPORT = env.env_bool("OBSERVATORY_GRPC_REUSEPORT", False)
OBSERVATORY_GRPC_PROCESSES = env.env_int("OBSERVATORY_GRPC_PROCESSES", os.cpu_count() or 1, minimum=1)
# The OTLP/HTTP receiver on a port of its own (manage.py otlp_http: Granian or uvicorn serving
# dashboard/ingest/receiver_app.py).
OBSERVATORY_OTLP_HTTP_HOST = env.env_str("OBSERVATORY_OTLP_HTTP_HOST", "127.0.0.1")
OBSERVATORY_OTLP_HTTP_PORT = env.env_int("OBSERVATORY_OTLP_HTTP_PORT", 4318, minimum=0)
OBSERVATORY_OTLP_HTTP_PROCESSES = env.env_int("OBSERVATORY_OTLP_HTTP_PROCESSES", os.cpu_count() or 1, minimum=1)
OBSERVATORY_OTLP_HTTP_MAX_CONNECTIONS = env.env_int("OBSERVATORY_OTLP_HTTP_MAX_CONNECTIONS", 1024, minimum=1)
OBSERVATORY_OTLP_HTTP_IDLE_TIMEOUT = env.env_int("OBSERVATORY_OTLP_HTTP_IDLE_TIMEOUT", 30, minimum=1)
OBSERVATORY_OTLP_HTTP_SERVER = env.otlp_http_server()

# Times an ingested record or span may carry (years, the upper one exclusive); items
# outside are refused one by one, like any other invalid item.
OBSERVATORY_TIMESTAMP_MIN_YEAR = env.env_int("OBSERVATORY_TIMESTAMP_MIN_YEAR", 1970, minimum=1)
OBSERVATORY_TIMESTAMP_MAX_YEAR = env.env_int("OBSERVATORY_TIMESTAMP_MAX_YEAR", 2200, minimum=2)
if OBSERVATORY_TIMESTAMP_MAX_YEAR <= OBSERVATORY_TIMESTAMP_MIN_YEAR or OBSERVATORY_TIMESTAMP_MAX_YEAR > 9999:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("OBSERVATORY_TIMESTAMP_MAX_YEAR must be above OBSERVATORY_TIMESTAMP_MIN_YEAR and at most 9999")

# Retention defaults (days) when a project has no RetentionPolicy of its own.
OBSERVATORY_RETENTION_SPAN_DAYS = env.env_int("OBSERVATORY_RETENTION_SPAN_DAYS", 14, minimum=1)
OBSERVATORY_RETENTION_RECORD_DAYS = env.env_int("OBSERVATORY_RETENTION_RECORD_DAYS", 90, minimum=1)
OBSERVATORY_RETENTION_ARTIFACT_DAYS = env.env_int(
    "OBSERVATORY_RETENTION_ARTIFACT_DAYS", 30, minimum=1
)

# Celery: with no broker the derivation tasks run eagerly in-process, so the
# embedded default needs no Redis. Eager errors propagate so tests see them.
CELERY_BROKER_URL = env.env_str("CELERY_BROKER_URL")
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
# With no broker, derivations run on one background thread per process that merges
# what ingest batches touched (dashboard/observatory/derive/runner.py); under tests, inline.
OBSERVATORY_DERIVE_DELAY_MS = env.env_int("OBSERVATORY_DERIVE_DELAY_MS", 500, minimum=0)
# First wait before a failed derivation note is tried again (then doubling, parked after 5 tries).
OBSERVATORY_DERIVE_RETRY_SECONDS = env.env_int("OBSERVATORY_DERIVE_RETRY_SECONDS", 2, minimum=0)
OBSERVATORY_DERIVE_INLINE = env.env_bool("OBSERVATORY_DERIVE_INLINE", env.running_tests())
# Ingest answers 429 (Retry-After) while the oldest derivation note due has waited
# longer than this and a drainer is at work: ingest is slowed to what the derivations
# keep up with, so the lag stays bounded. 0 turns it off (the default of the inline mode,
# where each batch is derived before its answer: no backlog, and no read of it per second).
OBSERVATORY_DERIVE_BACKLOG_SECONDS = env.env_int(
    "OBSERVATORY_DERIVE_BACKLOG_SECONDS", 0 if OBSERVATORY_DERIVE_INLINE else 10, minimum=0
)
# An hour's tool rollups are recomputed from its rows at most once in this many
# seconds by the outbox (the notes in between wait for it); 0 recomputes after every
# pass (the inline mode of the tests, where each batch is derived before the answer).
OBSERVATORY_ROLLUP_INTERVAL_SECONDS = env.env_int(
    "OBSERVATORY_ROLLUP_INTERVAL_SECONDS", 0 if OBSERVATORY_DERIVE_INLINE else 10, minimum=0
)
# SQLite: when the write-ahead log passes this size the runner tries (once a minute) to
# checkpoint it whole and truncate it (under steady ingest readers always overlap, so
# SQLite's own passive checkpoints never restart it: 8.8 GB in a 20-minute soak).
OBSERVATORY_SQLITE_WAL_LIMIT_MB = env.env_int("OBSERVATORY_SQLITE_WAL_LIMIT_MB", 256, minimum=1)
CELERY_RESULT_BACKEND = env.env_str("CELERY_RESULT_BACKEND") or None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE = {
    # Notes whose task message was lost (broker restart, a worker killed) are drained here.
    "derivation-outbox": {
        "task": "observatory.outbox_drain",
        "schedule": 5.0,
    },
    "tool-rollups-hourly": {
        "task": "observatory.rollup_recent_hours",
        "schedule": crontab(minute=5),
    },
    # PostgreSQL: the spans' daily partitions, created a week ahead (a no-op on SQLite).
    "span-partitions-hourly": {
        "task": "observatory.spans_partitions_maintain",
        "schedule": crontab(minute=15),
    },
    "retention-purge-daily": {
        "task": "observatory.purge_expired",
        "schedule": crontab(minute=30, hour=3),
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.env_str("LOG_LEVEL", "INFO").upper()},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
