"""gunicorn settings for the dashboard. Every value can be overridden from the environment."""

import gc
import multiprocessing
import os

bind = os.environ.get("OBSERVATORY_BIND", "127.0.0.1:8000")
# Two processes a core, four threads each: ingest is mostly database-bound, and a
# page waits behind the requests queued in its own process, so more, shorter queues
# keep pages fast under ingest (16 senders on 2 cores: page p95 0.22 s with 4
# processes, 0.46-0.61 s with 2; benchmarks/bench_chaos.py --no-kill).
workers = int(os.environ.get("WEB_CONCURRENCY", max(2, 2 * multiprocessing.cpu_count())))
# gthread, with the lingering close of a connection off the worker's event loop
# (gunicorn 26+ otherwise stops the worker for up to 2 s per client slow to close).
worker_class = "dashboard.gunicorn_worker.ThreadWorker"
threads = int(os.environ.get("WEB_THREADS", "4"))
timeout = int(os.environ.get("WEB_TIMEOUT", "30"))
graceful_timeout = 20
keepalive = 5
# Recycle workers now and then so a slow leak can never grow without bound.
max_requests = int(os.environ.get("WEB_MAX_REQUESTS", "20000"))
max_requests_jitter = 2000
# ...and by memory: a worker whose private memory passes this many MiB finishes its
# requests and is replaced (dashboard/worker_memory.py; 0 turns it off). Four
# workers at the ceiling plus the master stay under 400 MB PSS. A worker that imports
# the app itself (WEB_PRELOAD=0) has all of it private from the start: a higher default.
_preloading = os.environ.get("WEB_PRELOAD", "1") != "0"
worker_private_mb = int(os.environ.get("WEB_WORKER_PRIVATE_MB", "80" if _preloading else "160"))
worker_min_age = float(os.environ.get("WEB_WORKER_MIN_AGE_SECONDS", "60"))  # never replaced younger
# Request line and header limits; body limits are enforced by the ingest views.
limit_request_line = 8190
limit_request_fields = 100
accesslog = os.environ.get("WEB_ACCESS_LOG", "-")
errorlog = "-"
loglevel = os.environ.get("WEB_LOG_LEVEL", "info")
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")

# The app is imported once in the master and the workers are forked from it, so the
# ~70 MB of imported code is shared by all of them instead of copied into each
# (WEB_PRELOAD=0 to import in every worker). What must be per process starts after
# the fork: the embedded derivation thread (threads do not survive a fork) and the
# database connections (none is opened before it; closed again to be sure).
preload_app = _preloading
if preload_app:
    os.environ["OBSERVATORY_BACKGROUND_AFTER_FORK"] = "1"


def pre_fork(server, worker):
    if preload_app:
        from django.db import connections

        connections.close_all()
        # The imported app's objects go to the collector's permanent generation, so a
        # worker's collections never write to them and their pages stay shared with
        # the master: without it each worker had copied most of the master's heap
        # (private 70-80 MB, shared with the master 16 MB; benchmarks/bench_soak.py).
        gc.collect()
        gc.freeze()


def post_fork(server, worker):
    from dashboard.worker_memory import MemoryCeiling

    worker.observatory_ceiling = MemoryCeiling(worker_private_mb, min_age=worker_min_age)
    if preload_app:
        from dashboard.observatory.derive.runner import start_background

        start_background()


def post_request(worker, req, environ, resp):
    ceiling = worker.observatory_ceiling  # made in post_fork: its minimum age counts from the fork
    if worker.alive and ceiling.exceeded():
        worker.log.info("worker %s: %.0f MiB private memory, over %d: replaced after its requests",
                        worker.pid, ceiling.last_mib, worker_private_mb)
        worker.alive = False
