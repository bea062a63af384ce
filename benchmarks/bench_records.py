"""Records ingest, phase by phase, in-process (no HTTP): where the time of one
``POST /api/v1/records`` batch goes on a fresh SQLite (WAL) database.

    .venv/bin/python -m benchmarks.bench_records --batches 40 --size 500

Phases: JSON parse (with the depth check), pydantic validation (the endpoint's
``records_validate``: parse_record per record), the store (one transaction, one
INSERT … ON CONFLICT DO NOTHING per record type), and the three derivations that
run after commit (links, conversation totals, hourly rollups; under gunicorn a
background thread runs them, merged across batches). Every batch lands in the
same hour, so the rollup (which recomputes the whole hour from rows) grows with
the run: the worst case. End-to-end HTTP throughput under gunicorn is benchmarks.bench_ingest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from datetime import datetime, timezone


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--size", type=int, default=500)
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="bench-records-")
    os.environ.update(OBSERVATORY_DATA_DIR=data_dir, DEBUG="0", SECRET_KEY="b" * 50)
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    try:
        run(args.batches, args.size)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def run(batches: int, size: int) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    from dashboard.accounts.services import project_create
    from dashboard.ingest.api import records_validate
    from dashboard.ingest.common import load_json
    from dashboard.observatory import services
    from dashboard.observatory.derive.passes import links, rollups, totals

    call_command("migrate", verbosity=0)
    project = project_create(name="bench")
    now = datetime.now(timezone.utc).isoformat()

    def body(b: int) -> bytes:
        return json.dumps({"records": [
            {"type": "tool_result", "record_id": str(uuid.uuid4()), "conversation_id": f"conv-{b}-{i % 20}",
             "occurred_at": now, "tool_name": f"tool_{i % 7}", "parameters": {"query": "x" * 50},
             "result": {"tool_call_id": f"call_{b}_{i}", "observation": "row " * 40, "success": i % 9 != 0,
                        "duration_ms": 12.5 + i % 300, "observation_tokens": 80}}
            for i in range(size)
        ]}).encode()

    bodies = [body(b) for b in range(batches)]
    timings: dict[str, float] = {}

    def timed(name, fn):
        start = time.perf_counter()
        result = fn()
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
        return result

    for raw in bodies:
        data = timed("json", lambda: load_json(raw))
        records, rejected = timed("validate", lambda: records_validate(data["records"]))
        assert not rejected, rejected[:1]

        def store():
            with transaction.atomic():
                return services.records_store(project=project, records=records)

        outcome = timed("store", store)
        ids = sorted(outcome.conversation_ids)
        timed("links", lambda: links.links_refresh(project_id=project.pk, conversation_ids=ids))
        timed("timings", lambda: totals.conversation_totals_refresh(conversation_ids=ids))
        timed("rollups", lambda: rollups.tool_rollups_refresh(project_id=project.pk, minutes=outcome.tool_minutes))

    n = batches * size
    print(f"{batches} batches x {size} tool_result records, SQLite WAL, load average {os.getloadavg()[0]:.1f}")
    for name, seconds in timings.items():
        print(f"  {name:9} {seconds / batches * 1000:7.1f} ms/batch")
    ingest = sum(timings[k] for k in ("json", "validate", "store"))
    print(f"  ingest path (json+validate+store): {n / ingest:8.0f} records/s")
    print(f"  with eager derivations:            {n / sum(timings.values()):8.0f} records/s")


if __name__ == "__main__":
    main()
