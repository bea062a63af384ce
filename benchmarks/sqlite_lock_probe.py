"""How long SQLite's write lock is held, and by whom: ingest (request threads) or the
derivations (the runner's ``observatory-derive`` thread). For benchmarks only
(``bench_soak --lock-probe``, through benchmarks/gunicorn_lock_probe.conf.py).

Each gunicorn worker times its transactions from the moment BEGIN IMMEDIATE returns
(the lock is held) to the end of COMMIT or ROLLBACK, and the wait for BEGIN, and
writes its totals to ``OBSERVATORY_LOCK_PROBE_DIR/<pid>`` every second. The commit's
time includes SQLite's automatic checkpoint, which runs after the lock is let go: the
shares are an upper bound, and the commit share says how much of them that can be.
Statements outside a transaction (autocommit) are not counted.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

KINDS = ("ingest", "derive")
FIELDS = ("held", "waited", "transactions", "committing")
DIR = "OBSERVATORY_LOCK_PROBE_DIR"


def install() -> None:
    """In a gunicorn worker after the fork: time this process's transactions."""
    from django.db.backends.sqlite3.base import DatabaseWrapper

    totals = {kind: dict.fromkeys(FIELDS, 0.0) for kind in KINDS}
    lock = threading.Lock()
    begin, commit, rollback = (DatabaseWrapper._start_transaction_under_autocommit, DatabaseWrapper._commit,
                               DatabaseWrapper._rollback)

    def begun(self):
        asked = time.perf_counter()
        begin(self)
        self.lock_probe = (asked, time.perf_counter())

    def ending(original):
        def ended(self):
            closing = time.perf_counter()
            original(self)
            probe = getattr(self, "lock_probe", None)
            if probe is None:
                return
            self.lock_probe = None
            done = time.perf_counter()
            kind = "derive" if threading.current_thread().name.startswith("observatory-derive") else "ingest"
            with lock:
                row = totals[kind]
                row["held"] += done - probe[1]
                row["waited"] += probe[1] - probe[0]
                row["transactions"] += 1
                row["committing"] += done - closing
        return ended

    DatabaseWrapper._start_transaction_under_autocommit = begun
    DatabaseWrapper._commit = ending(commit)
    DatabaseWrapper._rollback = ending(rollback)
    target = Path(os.environ[DIR]) / str(os.getpid())

    def write() -> None:
        while True:
            time.sleep(1.0)
            with lock:
                text = json.dumps(totals)
            target.write_text(text)

    threading.Thread(target=write, name="lock-probe", daemon=True).start()


def totals(directory: Path) -> dict[str, dict[str, float]]:
    """The workers' totals so far, summed (a replaced worker's stay in its file)."""
    summed = {kind: dict.fromkeys(FIELDS, 0.0) for kind in KINDS}
    for path in directory.iterdir():
        try:
            worker = json.loads(path.read_text())
        except (OSError, ValueError):  # being written
            continue
        for kind in KINDS:
            for field in FIELDS:
                summed[kind][field] += worker.get(kind, {}).get(field, 0.0)
    return summed


def window_line(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], seconds: float) -> str:
    """What share of ``seconds`` each side held the lock between two totals."""
    parts = []
    for kind, name in (("ingest", "ingest"), ("derive", "derivations")):
        held = after[kind]["held"] - before[kind]["held"]
        count = after[kind]["transactions"] - before[kind]["transactions"]
        committing = after[kind]["committing"] - before[kind]["committing"]
        parts.append(f"{name} {held / seconds:.0%} ({count:.0f} transactions, {held / max(count, 1) * 1000:.0f} ms "
                     f"each, committing {committing / seconds:.0%})")
    return "write lock held: " + "; ".join(parts)
