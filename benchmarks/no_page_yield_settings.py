"""The dashboard's settings without ``PagePriorityMiddleware``: pages are not counted, so
ingest never steps aside for them (``dashboard.priority.yield_to_pages`` finds none).
For side-by-side runs only (``bench_chaos --no-page-yield``, deploy/SCALING.md)."""

from dashboard.settings import *  # noqa: F401,F403
from dashboard.settings import MIDDLEWARE

MIDDLEWARE = [name for name in MIDDLEWARE if name != "dashboard.priority.PagePriorityMiddleware"]
