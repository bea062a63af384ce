"""What SQLite's own work of storing a burst is, with no Python around it: the rows a
run stored (spans and everything derived from them) inserted again, with plain
sqlite3 executemany, into an empty copy of the schema, in as many transactions as
the run had batches. CPU µs a span, by table, with the schema's indexes and with its
unique ones only: the floor under any ingest and derivation code on SQLite's one writer.

    .venv/bin/python -m benchmarks.bench_burst --batches 20 --keep      # prints the data dir
    .venv/bin/python -m benchmarks.bench_soak --minutes 1 --keep        # or the soak's mix
    .venv/bin/python -m benchmarks.sqlite_floor --data-dir /tmp/bench-burst-…/data --transactions 20
    .venv/bin/python -m benchmarks.sqlite_floor --data-dir … --transactions 2000 --each-index observatory_span
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Callable


def floor(source: sqlite3.Connection, tables: dict[str, list[tuple]], *, keep: Callable[[str, str], bool],
          transactions: int) -> dict[str, float]:
    """CPU seconds by table of inserting ``tables``' rows (read from ``source``) again
    into an empty copy of its schema, with the indexes ``keep(name, sql)`` chooses."""
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sqlite-floor-") as directory:
        target = sqlite3.connect(Path(directory) / "floor.sqlite3", isolation_level=None)
        target.execute("PRAGMA journal_mode = WAL")
        for kind, name, sql in source.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'index') "
                "AND sql IS NOT NULL AND tbl_name LIKE 'observatory%' ORDER BY type = 'index'"):
            if kind == "table" or keep(name, sql):
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


def _unique(name: str, sql: str) -> bool:
    return sql.upper().startswith("CREATE UNIQUE")


def _every(name: str, sql: str) -> bool:
    return True


def each_index(source: sqlite3.Connection, table: str, rows: list[tuple], spans: int, transactions: int) -> None:
    """For each secondary index of ``table``: what inserting its rows costs a span
    without that index, against all of them (the first and last lines: all, twice, for
    the noise)."""
    indexes = [name for name, sql in source.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL", (table,))
        if not _unique(name, sql)]

    def cost(keep: Callable[[str, str], bool]) -> float:
        return floor(source, {table: rows}, keep=keep, transactions=transactions)[table] / max(spans, 1) * 1e6

    every = cost(_every)
    print(f"{table}: {every:.1f} µs a span with its {len(indexes)} secondary indexes", flush=True)
    for index in indexes:
        without = cost(lambda name, sql, index=index: name != index)
        print(f"  without {index:<34} {without:5.1f} µs a span (saves {every - without:4.1f})", flush=True)
    print(f"{table}: {cost(_every):.1f} µs a span with all of them, again", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="a data dir a benchmark kept (bench_burst or bench_soak --keep)")
    parser.add_argument("--transactions", type=int, default=50, help="as many as the run's batches")
    parser.add_argument("--each-index", metavar="TABLE",
                        help="instead: the cost of each secondary index of this table (observatory_span, …)")
    args = parser.parse_args(argv)
    database = Path(args.data_dir) / "observatory.sqlite3"
    if not database.exists() or args.transactions <= 0:
        raise SystemExit(f"no observatory.sqlite3 in {args.data_dir}, or --transactions not positive")
    source = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    names = [name for (name,) in source.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'observatory%'")]
    spans = source.execute('SELECT COUNT(*) FROM "observatory_span"').fetchone()[0]
    if args.each_index:
        if args.each_index not in names:
            raise SystemExit(f"no table {args.each_index!r}; one of {', '.join(names)}")
        rows = source.execute(f'SELECT * FROM "{args.each_index}"').fetchall()
        if not rows:
            raise SystemExit(f"{args.each_index} has no rows")
        each_index(source, args.each_index, rows, spans, args.transactions)
        return
    tables = {name: rows for name in names if (rows := source.execute(f'SELECT * FROM "{name}"').fetchall())}
    for unique_only in (False, True):
        seconds = floor(source, tables, keep=_unique if unique_only else _every,
                        transactions=args.transactions)
        biggest = sorted(seconds.items(), key=lambda item: -item[1])[:4]
        print(f"{'unique indexes only' if unique_only else 'all indexes':>19}: "
              f"{sum(seconds.values()) / max(spans, 1) * 1e6:.0f} µs a span ({spans:,} spans; at most "
              f"{spans / max(sum(seconds.values()), 1e-9):,.0f} spans/s on one writer doing nothing else); "
              + ", ".join(f"{table.removeprefix('observatory_')} {value / max(spans, 1) * 1e6:.0f}"
                          for table, value in biggest), flush=True)


if __name__ == "__main__":
    main()
