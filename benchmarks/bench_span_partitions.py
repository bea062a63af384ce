"""Converting a populated spans table to daily partitions (migration 0008), timed.

    .venv/bin/python -m benchmarks.bench_span_partitions --db-url postgres://user@127.0.0.1:5432/empty_db --spans 2000000

Needs an EMPTY PostgreSQL database: migrates it to 0007 (the plain spans table),
fills the table with --spans spans over the last 14 days with SQL (generate_series:
a third linked to conversations, a tenth tool spans), then times
``migrate observatory 0008`` and checks that the rows after are the rows before
(count and a checksum of id, span id and start time). Prints the table size too:
the conversion needs about that much free disk again while it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FILL = """
INSERT INTO accounts_project (name, slug, created_at) VALUES ('Bench', 'bench-partitions', now());
INSERT INTO observatory_conversation (project_id, external_id, title, user_id, model, status, started_at,
    last_activity_at, rounds, messages, tool_calls, errors, retries, input_tokens, output_tokens,
    max_context_tokens, compressions, has_errors, unpriced_rounds)
  SELECT (SELECT max(id) FROM accounts_project), 'conv-' || g, '', '', '', 'ok', now(), now(),
         0, 0, 0, 0, 0, 0, 0, 0, 0, false, 0
  FROM generate_series(1, 10000) g;
INSERT INTO observatory_span (project_id, trace_id, span_id, parent_span_id, name, kind, start_time, end_time,
    duration_ms, status_code, status_message, service_name, attributes, events, links, resource, conversation_id,
    conversation_key, tool_name, tool_call_id, operation, received_at, truncated)
  SELECT (SELECT max(id) FROM accounts_project), lpad(to_hex(g / 30), 32, '0'), lpad(to_hex(g), 16, '0'),
         CASE WHEN g % 30 = 0 THEN '' ELSE lpad(to_hex(g - g % 30), 16, '0') END, 'step ' || (g % 30), 1,
         now() - g * (14 * 86400.0 / %(n)s) * interval '1 second',
         now() - g * (14 * 86400.0 / %(n)s) * interval '1 second' + interval '5 ms', 5, 0, '', 'agent',
         jsonb_build_object('step', g % 30, 'http.method', 'POST'), '[]', '[]', '{"service.name": "agent"}',
         CASE WHEN g % 3 = 0 THEN (SELECT min(id) FROM observatory_conversation) + g % 10000 END, '',
         CASE WHEN g % 10 = 0 THEN 'search' ELSE '' END, CASE WHEN g % 10 = 0 THEN 'call_' || g ELSE '' END,
         '', now(), false
  FROM generate_series(1, %(n)s) g;
ANALYZE observatory_span;
"""
CHECK = "SELECT count(*), sum(hashtext(id::text || span_id || start_time::text)::bigint) FROM observatory_span"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db-url", required=True, help="postgres://... of an empty database")
    parser.add_argument("--spans", type=int, default=1_000_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as data_dir:
        os.environ.update(OBSERVATORY_DATA_DIR=data_dir, DATABASE_URL=args.db_url, LOG_LEVEL="WARNING",
                          DJANGO_SETTINGS_MODULE="dashboard.settings")
        os.environ.setdefault("SECRET_KEY", "bench-" + "k" * 40)
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        from dashboard.observatory.partitions import span_day_partitions, spans_partitioned

        if connection.vendor != "postgresql":
            raise SystemExit("PostgreSQL only (SQLite keeps its spans table as it is)")
        call_command("migrate", verbosity=0)
        call_command("migrate", "observatory", "0007", verbosity=0)
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(FILL.replace("%(n)s", str(int(args.spans))))
            cursor.execute(CHECK)
            before = cursor.fetchone()
            cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('observatory_span'))")
            size = cursor.fetchone()[0]
        print(f"filled {before[0]:,} spans ({size} with indexes) in {time.perf_counter() - started:.0f} s", flush=True)

        started = time.perf_counter()
        call_command("migrate", "observatory", "0008", verbosity=0)
        seconds = time.perf_counter() - started
        with connection.cursor() as cursor:
            cursor.execute(CHECK)
            after = cursor.fetchone()
            cursor.execute("SELECT count(*) FROM ONLY observatory_span_default")
            default = cursor.fetchone()[0]
        assert spans_partitioned()
        print(f"migration 0008: {seconds:.1f} s for {before[0]:,} spans ({before[0] / seconds:,.0f} spans/s); "
              f"{len(span_day_partitions())} daily partitions, {default:,} spans in the default one")
        print(f"rows before == rows after: {before == after} ({after[0]:,})")
        call_command("migrate", verbosity=0)


if __name__ == "__main__":
    main()
