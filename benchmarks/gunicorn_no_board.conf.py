"""deploy/gunicorn.conf.py without the page board and the write slots
(dashboard/priority.py): ingest then steps aside only for its own process's pages.
For side-by-side runs only (``bench_chaos --no-board``); run with
OBSERVATORY_MAX_CONCURRENT_WRITES=0 (the benchmark sets it)."""

import os
from pathlib import Path

_DEPLOYED = Path(__file__).resolve().parent.parent / "deploy" / "gunicorn.conf.py"
exec(compile(_DEPLOYED.read_text(), str(_DEPLOYED), "exec"))


def on_starting(server):  # noqa: F811 (the deployed hook made the board)
    os.environ.pop("OBSERVATORY_PAGE_BOARD", None)
