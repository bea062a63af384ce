"""gunicorn settings for the dashboard. Every value can be overridden from the environment."""

import multiprocessing
import os

bind = os.environ.get("OBSERVATORY_BIND", "127.0.0.1:8000")
# Ingest is mostly database-bound: a few processes with threads each keep both cores busy
# while one thread waits on a commit.
workers = int(os.environ.get("WEB_CONCURRENCY", max(2, multiprocessing.cpu_count())))
worker_class = "gthread"
threads = int(os.environ.get("WEB_THREADS", "4"))
timeout = int(os.environ.get("WEB_TIMEOUT", "30"))
graceful_timeout = 20
keepalive = 5
# Recycle workers now and then so a slow leak can never grow without bound.
max_requests = int(os.environ.get("WEB_MAX_REQUESTS", "20000"))
max_requests_jitter = 2000
# Request line and header limits; body limits are enforced by the ingest views.
limit_request_line = 8190
limit_request_fields = 100
accesslog = os.environ.get("WEB_ACCESS_LOG", "-")
errorlog = "-"
loglevel = os.environ.get("WEB_LOG_LEVEL", "info")
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
