"""What SQLite's own work of storing a burst is, with no Python around it: the rows a
run stored (spans and everything derived from them) inserted again, with plain
sqlite3 executemany, into an empty copy of the schema, in as many transactions as
the run had batches. CPU µs a span, by table, with the schema's indexes and with its
unique ones only: the floor under any ingest and derivation code on SQLite's one writer.

    .venv/bin/python -m benchmarks.bench_burst --batches 20 --keep      # prints the data dir
    .venv/bin/python -m benchmarks.bench_soak --minutes 1 --keep        # or the soak's mix
    .venv/bin/python -m benchmarks.sqlite_floor --data-dir /tmp/bench-burst-…/data --transactions 20
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path


def floor(source: sqlite3.Connection, tables: dict[str, list[tuple]], *, unique_only: bool,
          transactions: int) -> dict[str, float]:
    """CPU seconds by table of inserting ``tables``' rows (read from ``source``) again
    into an empty copy of its schema."""
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sqlite-floor-") as directory:
        target = sqlite3.connect(Path(directory) / "floor.sqlite3", isolation_level=None)
        target.execute("PRAGMA journal_mode = WAL")
        for kind, sql in source.execute("SELECT type, sql FROM sqlite_master WHERE type IN ('table', 'index') "
                                        "AND sql IS NOT NULL AND tbl_name LIKE 'observatory%' "
                                        "ORDER BY type = 'index'"):
            if kind == "table" or not unique_only or sql.upper().startswith("CREATE UNIQUE"):
                target.execute(sql)
        for table, rows in tables.items():
            insert = f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(rows[0]))})'
            step = max(1, -(-len(rows) // transactions))
            started = time.process_time()
            for start in range(0, len(rows), step):
                target.execute("BEGIN IMMEDIATE")
                target.executemany(insert, rows[start:start + step])
                target.execute("COMMIT")
            seconds[table] = time.process_time() - started
        target.close()
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="a data dir a benchmark kept (bench_burst --keep)")
    parser.add_argument("--transactions", type=int, default=50, help="as many as the run's batches")
    args = parser.parse_args(argv)
    database = Path(args.data_dir) / "observatory.sqlite3"
    if not database.exists() or args.transactions <= 0:
        raise SystemExit(f"no observatory.sqlite3 in {args.data_dir}, or --transactions not positive")
    source = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    tables = {name: rows for (name,) in source.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'observatory%'")
        if (rows := source.execute(f'SELECT * FROM "{name}"').fetchall())}
    spans = len(tables.get("observatory_span", ()))
    for unique_only in (False, True):
        seconds = floor(source, tables, unique_only=unique_only, transactions=args.transactions)
        biggest = sorted(seconds.items(), key=lambda item: -item[1])[:4]
        print(f"{'unique indexes only' if unique_only else 'all indexes':>19}: "
              f"{sum(seconds.values()) / max(spans, 1) * 1e6:.0f} µs a span ({spans:,} spans; at most "
              f"{spans / max(sum(seconds.values()), 1e-9):,.0f} spans/s on one writer doing nothing else); "
              + ", ".join(f"{table.removeprefix('observatory_')} {value / max(spans, 1) * 1e6:.0f}"
                          for table, value in biggest), flush=True)


if __name__ == "__main__":
    main()
