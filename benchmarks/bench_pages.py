"""Server time of every page on a large database.

    .venv/bin/python -m benchmarks.bench_pages                      # quick: 5k conversations
    .venv/bin/python -m benchmarks.bench_pages --conversations 100000 --tool-executions 1000000
    .venv/bin/python -m benchmarks.bench_pages --db-url postgres://user@127.0.0.1:5432/bench
    .venv/bin/python -m benchmarks.bench_pages --csv-rows 1000000      # + a 1M-row CSV stream's memory
    .venv/bin/python -m benchmarks.bench_pages --scores 1000000        # + 1M scores (judging pages, filters)
    .venv/bin/python -m benchmarks.bench_pages --scores 1000000 --data-dir /tmp/pages  # seeded once, kept:
                                                                  # the same command again measures it
    .venv/bin/python -m benchmarks.bench_pages --db-url postgres://… --conversations 100000 \
        --tool-executions 1000000 --spans 10000000 --retention   # 10M spans, then drop one day of them

Seeds a fresh database (SQLite in a temp data dir unless --db-url) with bulk inserts:
conversations with rounds, tool executions spread over the last week across tools,
levels and outcomes, a compression event, a trace, artifacts. The hourly tool
rollups are computed by the real derivation code (the task's body); conversation
totals are filled in by the seeder from what it inserted (--real-totals runs the
derivation instead: exact, but minutes on 100k conversations). Each page is then
requested --requests times through Django's test Client, logged in, and the table
prints each page's p50 / p95 server time. Target: p95 < 100 ms.

On PostgreSQL the rows go in with COPY (the ingest's own bulk insert path), SQLite
keeps bulk inserts. With --spans N, N spans are seeded besides: each conversation's
rounds are traces (a root, a model call per round, a tool span per tool execution,
linked to it as the link task would, and plain child spans to make up the count),
plus one span-only tool call (no record, some failed) per twenty tool executions.
With --retention (PostgreSQL, after the pages) one full day of spans is dropped the
way the daily purge does it, and its time printed. Target: < 1 s.

Costs: rounds and conversations are priced by the seeder with the real price
table (gpt-4o and claude-3-sonnet have seeded prices, deepseek-chat none), the
hourly usage rollups by the real derivation. Two conversations of --compare-rounds
rounds (two tool calls each, a compression every 50) serve the compare page.
With --csv-rows N, one more conversation gets N tool executions and its tool-call
CSV is streamed through the test client while the process's resident memory is
sampled: the figure is the growth over the stream (bounded memory: one fetch of
rows at a time, never the file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ["query_sales", "load_csv", "web_search", "run_sql", "plot_chart", "read_file", "summarise", "forecast"]
MODELS = ["gpt-4o", "claude-3-sonnet", "deepseek-chat"]
BATCH = 5000


def setup_django(db_url: str, data_dir: str) -> None:
    os.environ["OBSERVATORY_DATA_DIR"] = data_dir
    os.environ.setdefault("SECRET_KEY", "bench-" + "k" * 40)
    os.environ["DJANGO_SETTINGS_MODULE"] = "dashboard.settings"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    if db_url:
        os.environ["DATABASE_URL"] = db_url
    else:
        os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["testserver", "localhost"]
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def store(model, objects: list) -> None:
    """Insert model instances: COPY on PostgreSQL (through the ingest's bulk insert,
    which adapts the values), bulk_create in one transaction on SQLite."""
    from django.db import connection, transaction

    if not objects:
        return
    if connection.vendor == "postgresql":
        from dashboard.observatory.rows import insert_ignoring_conflicts

        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        with transaction.atomic():
            insert_ignoring_conflicts(model, [{f.attname: getattr(o, f.attname) for f in fields} for o in objects])
    else:
        with transaction.atomic():
            model.objects.bulk_create(objects)


SPAN_CHUNK = 50_000


def seed_spans(project, conv: list, total: int, tool_executions: int, rounds_per_conversation: int) -> list[int]:
    """About ``total`` spans for the conversations ``conv`` [(id, started_at, model)]:
    one trace per round (root, model call, the round's tool calls, plain children),
    and one span-only tool call per twenty tool executions. Returns the span id of
    each tool execution's call (ids are given here; the sequence is moved past them)."""
    from django.db import connection, transaction

    from dashboard.observatory.models import Span
    from dashboard.observatory.rows import insert_values_ignoring_conflicts, json_text, sqlite_datetime

    postgres = connection.vendor == "postgresql"
    when = (lambda moment: moment) if postgres else sqlite_datetime
    columns = ["id", "project_id", "trace_id", "span_id", "parent_span_id", "name", "kind", "start_time", "end_time",
               "duration_ms", "status_code", "status_message", "service_name", "attributes", "events", "links",
               "resource", "conversation_id", "conversation_key", "tool_name", "tool_call_id", "operation",
               "received_at", "truncated"]
    resource = json_text({"service.name": "agent", "telemetry.sdk.language": "python"})
    received = when(datetime.now(timezone.utc))
    conversations = len(conv)
    span_only = tool_executions // 20
    rounds = conversations * rounds_per_conversation
    plain = max(total - rounds * 2 - tool_executions - span_only, 0)
    plain_per_round, extra = divmod(plain, rounds)
    linked = [0] * tool_executions
    calls_of: list[list[int]] = [[] for _ in range(conversations)]
    for n in range(tool_executions):
        calls_of[n % conversations].append(n)
    rows: list = []
    next_id = 1
    started = time.perf_counter()

    def flush() -> None:
        with transaction.atomic():
            if postgres:
                with connection.cursor() as cursor:
                    try:  # the seeder's own rows: skip the per-row foreign-key triggers (superuser only)
                        with transaction.atomic():
                            cursor.execute("SET LOCAL session_replication_role = replica")
                    except Exception:
                        pass
            insert_values_ignoring_conflicts(Span, columns, rows)
        rows.clear()

    def add(trace: str, parent: str, name: str, moment: datetime, ms: float, conversation_id, attributes: dict,
            key: str = "", tool: str = "", call: str = "", operation: str = "", status: int = 0) -> tuple[int, str]:
        nonlocal next_id
        span_id = f"{next_id:016x}"
        rows.append((next_id, project.pk, trace, span_id, parent, name, 1, when(moment),
                     when(moment + timedelta(milliseconds=ms)), ms, status, "failed" if status == 2 else "", "agent",
                     json_text(attributes), "[]", "[]", resource, conversation_id, key, tool, call, operation,
                     received, False))
        next_id += 1
        if len(rows) >= SPAN_CHUNK:
            flush()
        return next_id - 1, span_id

    for c, (conversation_id, at, model) in enumerate(conv):
        key = f"conv-{c:07d}"
        for r in range(rounds_per_conversation):
            trace = f"{conversation_id:016x}{r:016x}"
            begin = at + timedelta(seconds=r * 30)
            _, root = add(trace, "", "invoke_agent agent", begin, 25_000.0, conversation_id,
                          {"gen_ai.conversation.id": key, "gen_ai.operation.name": "invoke_agent"}, key=key,
                          operation="invoke_agent")
            add(trace, root, f"chat {model}", begin + timedelta(milliseconds=5), 1800.0, conversation_id,
                {"gen_ai.conversation.id": key, "gen_ai.request.model": model, "gen_ai.operation.name": "chat",
                 "gen_ai.usage.input_tokens": 900, "gen_ai.usage.output_tokens": 100}, key=key, operation="chat")
            for k, n in enumerate(calls_of[c]):
                if k % rounds_per_conversation != r:
                    continue
                tool = TOOLS[n % len(TOOLS)]
                linked[n], _ = add(trace, root, f"execute_tool {tool}", at + timedelta(seconds=k * 30 + 1), 120.0,
                                   conversation_id, {"gen_ai.tool.name": tool, "gen_ai.tool.call.id": f"call_{n:09d}",
                                                     "gen_ai.operation.name": "execute_tool"},
                                   tool=tool, call=f"call_{n:09d}", operation="execute_tool")
            for p in range(plain_per_round + (1 if c * rounds_per_conversation + r < extra else 0)):
                add(trace, root, f"step {p}", begin + timedelta(milliseconds=20 + p), 3.0, conversation_id,
                    {"step": p, "http.method": "POST"})
    for n in range(span_only):  # tool calls known only from spans: no record, no conversation
        _, at, _ = conv[n % conversations]
        tool = TOOLS[n % len(TOOLS)]
        add(f"{n:032x}", "", f"execute_tool {tool}", at + timedelta(seconds=7), 95.0, None,
            {"gen_ai.tool.name": tool, "gen_ai.tool.call.id": f"span_call_{n}"}, tool=tool, call=f"span_call_{n}",
            operation="execute_tool", status=2 if n % 10 == 0 else 0)
    if rows:
        flush()
    if postgres:
        with connection.cursor() as cursor:
            cursor.execute("SELECT setval(pg_get_serial_sequence('observatory_span', 'id'), %s)", [next_id])
            cursor.execute("ANALYZE observatory_span")  # what autovacuum does after a load this size
    print(f"  spans: {next_id - 1:,} in {time.perf_counter() - started:.1f} s", flush=True)
    return linked


def seed(conversations: int, tool_executions: int, rounds_per_conversation: int, real_totals: bool,
         compare_rounds: int = 200, spans: int = 0) -> dict:
    from django.contrib.auth import get_user_model

    from dashboard.accounts.services import project_create
    from dashboard.observatory import costs
    from dashboard.observatory.derive.passes import rollups, totals
    from dashboard.tuning.pricing import PriceTable
    from dashboard.observatory.models import (
        CompressionEvent,
        Conversation,
        Round,
        Span,
        ToolExecution,
    )

    rng = random.Random(42)
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    week = timedelta(days=7).total_seconds()
    user = get_user_model().objects.create_user("bench", password="bench-password-123")
    project = project_create(name="Bench", owner=user)

    # Per-execution facts that the conversation totals depend on are pure functions
    # of the execution number, so totals can be filled in before the rows exist.
    def failed(n: int) -> bool:
        return (n * 2654435761) % 100 < 8

    def retries(n: int) -> int:
        return 1 if (n * 40503) % 4 == 0 else 0

    per_conversation = [[0, 0, 0] for _ in range(conversations)]  # calls, errors, retries
    for n in range(tool_executions):
        stats = per_conversation[n % conversations]
        stats[0] += 1
        stats[1] += failed(n)
        stats[2] += retries(n)

    table = PriceTable.load()

    def round_cost(model: str, at: datetime):
        price = table.price_for(model, at)
        return None if price is None else price.cost(900, 100)

    started = time.perf_counter()
    conversation_rows = []
    for i in range(conversations):
        at = now - timedelta(seconds=rng.random() * week)
        calls, errors, retried = per_conversation[i]
        cost = round_cost(MODELS[i % len(MODELS)], at)
        last = at + timedelta(seconds=max(rounds_per_conversation - 1, (calls - 1) if calls else 0) * 30 + 1)
        conversation_rows.append(Conversation(
            project=project, external_id=f"conv-{i:07d}", title=f"Question {i} about sales in region {i % 17}",
            user_id=f"user-{i % 500}", model=MODELS[i % len(MODELS)], started_at=at, last_activity_at=last,
            rounds=rounds_per_conversation, tool_calls=calls, errors=errors, retries=retried,
            has_errors=errors > 0, status="ok", input_tokens=900 * rounds_per_conversation,
            output_tokens=100 * rounds_per_conversation, max_context_tokens=1000 * rounds_per_conversation,
            totals_updated_at=now, cost_pico_usd=None if cost is None else cost * rounds_per_conversation,
            unpriced_rounds=rounds_per_conversation if cost is None else 0,
        ))
    store(Conversation, conversation_rows)
    conv = list(Conversation.objects.filter(project=project).order_by("id").values_list("id", "started_at", "model"))
    print(f"  conversations: {len(conv):,} in {time.perf_counter() - started:.1f} s", flush=True)
    linked = seed_spans(project, conv, spans, tool_executions, rounds_per_conversation) if spans else None

    started = time.perf_counter()
    rounds = []
    for conversation_id, at, model in conv:
        for index in range(rounds_per_conversation):
            rounds.append(Round(
                record_id=uuid.uuid4(), project=project, conversation_id=conversation_id,
                occurred_at=at + timedelta(seconds=index * 30), round_id=f"{conversation_id}-r{index}", index=index,
                user_message=f"What were the sales in region {conversation_id % 17}?",
                trace_id=f"{conversation_id:016x}{index:016x}" if spans else "",
                thoughts=["Query the sales table."], final_answer="Sales were 12.", context_tokens=1000 * (index + 1),
                derived_context_tokens=1000 * (index + 1),
                context_window=128_000, compression_threshold=0.8, input_tokens=900, output_tokens=100,
                cost_pico_usd=round_cost(model, at),
            ))
            if len(rounds) >= BATCH:
                store(Round, rounds)
                rounds = []
    store(Round, rounds)
    print(f"  rounds: {len(conv) * rounds_per_conversation:,} in {time.perf_counter() - started:.1f} s", flush=True)

    started = time.perf_counter()
    rows = []
    for n in range(tool_executions):
        conversation_id, at, _ = conv[n % len(conv)]
        success = not failed(n)
        level = rng.choice(["brief", "standard", "standard", "full"])
        tokens = {"brief": rng.randrange(5, 30), "standard": rng.randrange(40, 200), "full": rng.randrange(300, 3000)}
        rows.append(ToolExecution(
            record_id=uuid.uuid4(), project=project, conversation_id=conversation_id,
            occurred_at=at + timedelta(seconds=(n // len(conv)) * 30 + 1),
            round_id=f"{conversation_id}-r{(n // len(conv)) % rounds_per_conversation}",
            tool_name=rng.choice(TOOLS), parameters={"region": "north"}, model="gpt-4o",
            tool_call_id=f"call_{n:09d}", observation=f"{level} observation {n}", output_level=level,
            success=success, error_type="" if success else rng.choice(["timeout", "validation", "network"]),
            error_message="" if success else "failed", retry_count=retries(n),
            duration_ms=rng.lognormvariate(4.5, 1.2), observation_tokens=tokens[level], cache_hit=rng.random() < 0.1,
            brief_observation="brief", brief_tokens=tokens["brief"], standard_observation="standard",
            standard_tokens=tokens["standard"], full_observation="full", full_tokens=tokens["full"],
            linked_span_id=linked[n] if linked else None,
        ))
        if len(rows) >= BATCH:
            store(ToolExecution, rows)
            rows = []
    store(ToolExecution, rows)
    print(f"  tool executions: {tool_executions:,} in {time.perf_counter() - started:.1f} s", flush=True)

    target = conv[0][0]
    compression = CompressionEvent.objects.create(
        record_id=uuid.uuid4(), project=project, conversation_id=target, occurred_at=now,
        round_id=f"{target}-r0", mode="extract", tokens_before=9000, tokens_after=4000, target_tokens=4500,
        result={
            "mode": "extract", "target_tokens": 4500, "tokens_before": 9000, "tokens_after": 4000,
            "messages_before": 40, "messages_after": 20, "target_met": True,
            "changes": [
                {"index": i, "role": "tool" if i % 2 else "assistant", "priority": "medium",
                 "action": "kept" if i % 3 else "dropped", "tokens_before": 225,
                 "tokens_after": 225 if i % 3 else 0, "content_before": f"message {i} " * 30}
                for i in range(40)
            ],
            "config": {"strategy": "extract", "threshold_ratio": 0.8},
        },
    )
    trace_id = "ab" * 16
    Round.objects.filter(conversation_id=target, index=0).update(trace_id=trace_id)
    spans = [Span(project=project, trace_id=trace_id, span_id=f"{i:016x}", parent_span_id="" if i == 0 else f"{0:016x}",
                  name=f"span {i}", start_time=now + timedelta(milliseconds=i * 10),
                  end_time=now + timedelta(milliseconds=i * 10 + 50), duration_ms=50.0,
                  attributes={"gen_ai.tool.name": TOOLS[i % len(TOOLS)]}) for i in range(60)]
    Span.objects.bulk_create(spans)

    started = time.perf_counter()
    hours = {now - timedelta(hours=h) for h in range(0, 24 * 8 + 2)}
    rollups.tool_rollups_refresh(project_id=project.pk, hours=hours)
    print(f"  hourly tool rollups (real derivation): {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    costs.usage_hours_refresh(project_id=project.pk, hours=hours)
    print(f"  hourly usage rollups (real derivation): {time.perf_counter() - started:.1f} s", flush=True)
    if real_totals:
        started = time.perf_counter()
        ids = [c for c, _, _ in conv]
        for i in range(0, len(ids), 2000):
            totals.conversation_totals_refresh(conversation_ids=ids[i: i + 2000])
        print(f"  conversation totals (real derivation): {time.perf_counter() - started:.1f} s", flush=True)
    else:
        print("  conversation totals: filled in by the seeder (use --real-totals to run the derivation)")

    execution = ToolExecution.objects.filter(project=project, conversation_id=target).first()
    compared = [long_conversation(project, f"compare-{side}", compare_rounds, now, seed=side) for side in (1, 2)]
    from dashboard.web.models import SavedView

    for i in range(20):
        SavedView.objects.create(project=project, owner=user, name=f"view {i}", query=f"user=user-{i}", shared=i % 2 == 0)
    seeded_round = Round.objects.filter(conversation_id=conv[1][0]).order_by("index").first()
    return {"user": user, "project": project, "conversation": target, "execution": execution.pk,
            "compression": compression.pk, "trace": trace_id, "compare": compared,
            "seeded_trace": seeded_round.trace_id or trace_id, "round": seeded_round.pk}


def long_conversation(project, external_id: str, rounds: int, now: datetime, *, seed: int) -> int:
    """A conversation of ``rounds`` rounds, two tool calls each (levels and
    outcomes vary with ``seed``) and a compression every 50 rounds, with its
    totals and costs from the real derivation."""
    from django.db import transaction

    from dashboard.observatory.derive.passes import totals
    from dashboard.observatory.models import CompressionEvent, Conversation, Round, ToolExecution

    rng = random.Random(seed)
    start = now - timedelta(hours=2)
    conversation = Conversation.objects.create(project=project, external_id=external_id, started_at=start,
                                               last_activity_at=start, model="gpt-4o")
    common = {"project": project, "conversation": conversation}
    with transaction.atomic():
        Round.objects.bulk_create([
            Round(record_id=uuid.uuid4(), occurred_at=start + timedelta(seconds=20 * i), round_id=f"{external_id}-r{i}",
                  index=i, model="gpt-4o", user_message=f"Question {i}: sales in region {i % 7}?",
                  thoughts=["Query the sales table."], final_answer=f"Sales were {rng.randrange(100)}.",
                  context_tokens=1000 + 150 * i, context_window=128_000, compression_threshold=0.8,
                  input_tokens=900 + 150 * i, output_tokens=100, **common)
            for i in range(rounds)
        ])
        ToolExecution.objects.bulk_create([
            ToolExecution(record_id=uuid.uuid4(), occurred_at=start + timedelta(seconds=20 * i + k + 1),
                          round_id=f"{external_id}-r{i}", tool_name=TOOLS[(i + k) % len(TOOLS)],
                          parameters={"region": f"r{(i + seed) % 5}", "limit": 10 * k}, model="gpt-4o",
                          tool_call_id=f"{external_id}_{i}_{k}", observation="rows", success=rng.random() > 0.1,
                          output_level=rng.choice(["brief", "standard", "full"]), duration_ms=rng.lognormvariate(4, 1),
                          observation_tokens=rng.randrange(10, 900), retry_count=rng.choice([0, 0, 1]), **common)
            for i in range(rounds) for k in range(2)
        ])
        CompressionEvent.objects.bulk_create([
            CompressionEvent(record_id=uuid.uuid4(), occurred_at=start + timedelta(seconds=20 * i + 5),
                             round_id=f"{external_id}-r{i}", mode="extract", tokens_before=9000, tokens_after=4000,
                             target_tokens=4500, result={"mode": "extract", "config": {"strategy": "extract"}},
                             **common)
            for i in range(49, rounds, 50)
        ])
    totals.conversation_totals_refresh(conversation_ids=[conversation.pk])
    return conversation.pk


def seed_scores(project, total: int) -> None:
    """``total`` scores over the last week on the project's rounds, tool calls and
    conversations: thumbs (boolean), stars 1-5 (numeric, configured) and a verdict
    (categorical, configured, one label negative), with their links set as the link
    pass would."""
    from dashboard.judging.models import Score, ScoreConfig
    from dashboard.judging.rules import ScoreKind
    from dashboard.observatory.models import Round, ToolExecution

    ScoreConfig.objects.create(project=project, name="stars", kind=ScoreKind.NUMERIC, min_value=1, max_value=5)
    ScoreConfig.objects.create(project=project, name="verdict", kind=ScoreKind.CATEGORICAL,
                               labels=["correct", "partial", "wrong"], negative_labels=["wrong"])
    rng = random.Random(7)
    now = datetime.now(timezone.utc)
    week = timedelta(days=7).total_seconds()
    rounds = list(Round.objects.filter(project=project).values_list("pk", "conversation_id", "trace_id"))
    calls = list(ToolExecution.objects.filter(project=project).values_list("pk", "conversation_id"))
    batch = []
    for i in range(total):
        at = now - timedelta(seconds=rng.random() * week)
        kind = rng.random()
        fields = {"project": project, "score_id": f"bench-{i}", "source": "api", "occurred_at": at, "created_at": at,
                  "updated_at": at, "author_name": "bench"}
        if kind < 0.5:
            round_pk, conversation_id, trace_id = rng.choice(rounds)
            stars = rng.randint(1, 5)
            fields.update(name="stars", kind=ScoreKind.NUMERIC, value=float(stars), negative=stars < 3,
                          target="round", round_id=round_pk, conversation_id=conversation_id)
        elif kind < 0.8:
            call_pk, conversation_id = rng.choice(calls)
            good = rng.random() < 0.8
            fields.update(name="feedback", kind=ScoreKind.BOOLEAN, value=1.0 if good else 0.0, negative=not good,
                          target="tool_call", tool_execution_id=call_pk, conversation_id=conversation_id)
        else:
            _, conversation_id, _ = rng.choice(rounds)
            label = rng.choice(["correct", "correct", "partial", "wrong"])
            fields.update(name="verdict", kind=ScoreKind.CATEGORICAL, label=label, negative=label == "wrong",
                          target="conversation", conversation_id=conversation_id)
        batch.append(Score(**fields))
        if len(batch) == BATCH * 4:
            store(Score, batch)
            batch = []
    store(Score, batch)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def csv_stream_memory(seeded: dict, rows: int) -> dict:
    """Seed one conversation with ``rows`` tool executions, stream its tool-call
    CSV through the client and sample the resident memory every 10,000 lines."""
    from django.db import transaction
    from django.test import Client

    from dashboard.observatory.models import Conversation, ToolExecution

    project = seeded["project"]
    now = datetime.now(timezone.utc)
    conversation = Conversation.objects.create(project=project, external_id="csv-export", model="gpt-4o",
                                               started_at=now, last_activity_at=now)
    started = time.perf_counter()
    for offset in range(0, rows, BATCH):
        with transaction.atomic():
            ToolExecution.objects.bulk_create([
                ToolExecution(record_id=uuid.uuid4(), project=project, conversation=conversation,
                              occurred_at=now + timedelta(milliseconds=n), round_id=f"r{n // 4}",
                              tool_name=TOOLS[n % len(TOOLS)], parameters={"region": "north", "n": n}, model="gpt-4o",
                              tool_call_id=f"csv_{n:09d}", observation="rows", output_level="standard",
                              success=n % 13 != 0, error_message="" if n % 13 else "=cmd|' /C calc'!A0",
                              duration_ms=12.5, observation_tokens=40)
                for n in range(offset, min(rows, offset + BATCH))
            ])
    print(f"  CSV conversation: {rows:,} tool executions in {time.perf_counter() - started:.1f} s", flush=True)
    client = Client()
    client.force_login(seeded["user"])
    import gc

    gc.collect()
    before = peak = rss_bytes()
    started = time.perf_counter()
    response = client.get(f"/p/{project.slug}/conversations/{conversation.pk}/tool-calls.csv")
    lines = size = 0
    for chunk in response.streaming_content:
        lines += 1
        size += len(chunk)
        if lines % 10_000 == 0:
            peak = max(peak, rss_bytes())
    seconds = time.perf_counter() - started
    peak = max(peak, rss_bytes())
    return {"rows": lines - 1, "bytes": size, "seconds": seconds, "rss_before": before, "rss_growth": peak - before}


def artifacts(project, count: int = 20) -> None:
    import hashlib
    import io

    from dashboard.observatory.services import artifact_store

    for i in range(count):
        data = f"region,total\nnorth,{i}\n".encode()
        artifact_store(project=project, artifact_id=f"artifact_{i:032x}", stream=io.BytesIO(data),
                       sha256=hashlib.sha256(data).hexdigest(), content_type="text/csv", max_bytes=1 << 20)


def measure(seeded: dict, requests: int) -> list[tuple[str, float, float, int]]:
    from django.test import Client

    client = Client()
    client.force_login(seeded["user"])
    slug = seeded["project"].slug
    first = client.get(f"/p/{slug}/conversations/").content.decode()
    import re

    after = re.search(r'href="\?([^"]*)" rel="next"', first)
    trace_after = re.search(r'href="\?([^"]*)" rel="next"', client.get(f"/p/{slug}/traces/").content.decode())
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=5)
    bucket, bucket_end = hour.strftime("%Y-%m-%dT%H:%M"), (hour + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    pages = [
        ("overview", f"/p/{slug}/"),
        ("overview 30d", f"/p/{slug}/?range=30d"),
        ("conversations", f"/p/{slug}/conversations/"),
        ("conversations page 2", f"/p/{slug}/conversations/?" + (after.group(1).replace("&amp;", "&") if after else "")),
        ("conversations rows (htmx)", f"/p/{slug}/conversations/rows/"),
        ("conversations user+model", f"/p/{slug}/conversations/?user=user-7&model=gpt-4o"),
        ("conversations has errors", f"/p/{slug}/conversations/?has_errors=on"),
        ("conversations tool", f"/p/{slug}/conversations/?tool=forecast"),
        ("conversations search", f"/p/{slug}/conversations/?q=region+5"),
        ("conversations search, no match", f"/p/{slug}/conversations/?q=zebra+quartz"),
        ("conversation timeline", f"/p/{slug}/conversations/{seeded['conversation']}/"),
        ("observation (htmx)", f"/p/{slug}/tool-executions/{seeded['execution']}/observation/"),
        ("tools 24h", f"/p/{slug}/tools/?range=24h"),
        ("tools 7d", f"/p/{slug}/tools/?range=7d"),
        ("tool detail 7d", f"/p/{slug}/tools/query_sales/?range=7d"),
        ("tool detail 24h", f"/p/{slug}/tools/forecast/?range=24h"),
        ("level comparison", f"/p/{slug}/tool-executions/{seeded['execution']}/levels/?range=24h"),
        ("compression diff", f"/p/{slug}/compressions/{seeded['compression']}/"),
        ("artifacts", f"/p/{slug}/artifacts/"),
        ("trace", f"/p/{slug}/traces/{seeded['trace']}/"),
        ("traces", f"/p/{slug}/traces/"),
        ("traces page 2", f"/p/{slug}/traces/?" + (trace_after.group(1).replace("&amp;", "&") if trace_after else "")),
        ("traces with errors", f"/p/{slug}/traces/?has_errors=on"),
        ("traces longer than 20 s", f"/p/{slug}/traces/?min_ms=20000"),
        ("traces span name search", f"/p/{slug}/traces/?q=forecast"),
        ("traces of one hour", f"/p/{slug}/traces/?since={bucket}&until={bucket_end}"),
        ("traces of a conversation", f"/p/{slug}/traces/?conversation={seeded['conversation']}"),
        ("a seeded trace", f"/p/{slug}/traces/{seeded['seeded_trace']}/"),
        ("round waterfall (htmx)", f"/p/{slug}/rounds/{seeded['round']}/waterfall/"),
        ("logs", f"/p/{slug}/logs/"),
        ("compare 200 rounds each, page 1", f"/p/{slug}/compare/?a={seeded['compare'][0]}&b={seeded['compare'][1]}"),
        ("compare 200 rounds each, page 4",
         f"/p/{slug}/compare/?a={seeded['compare'][0]}&b={seeded['compare'][1]}&page=4"),
        ("overview 24h (hourly series)", f"/p/{slug}/?range=24h"),
        ("overview 90d (daily series)", f"/p/{slug}/?range=90d"),
        ("tool detail 30d (daily series)", f"/p/{slug}/tools/query_sales/?range=30d"),
        ("tool failures in one hour", f"/p/{slug}/tools/query_sales/?range=7d&since={bucket}&until={bucket_end}"),
        ("conversations of one hour", f"/p/{slug}/conversations/?since={bucket}&until={bucket_end}"),
        ("conversations one user (+cost)", f"/p/{slug}/conversations/?user=user-7"),
        ("saved views", f"/p/{slug}/views/"),
        ("tools CSV 7d", f"/p/{slug}/tools/export.csv?range=7d"),
        ("tool calls CSV (400 rows)", f"/p/{slug}/conversations/{seeded['compare'][0]}/tool-calls.csv"),
        ("scores 24h", f"/p/{slug}/scores/?range=24h"),
        ("scores 7d", f"/p/{slug}/scores/?range=7d"),
        ("conversations with negative feedback", f"/p/{slug}/conversations/?negative=on"),
        ("conversations stars at most 2", f"/p/{slug}/conversations/?score=stars&score_max=2"),
        ("traces with negative feedback", f"/p/{slug}/traces/?negative=on"),
        ("review queues", f"/p/{slug}/review/"),
        ("datasets", f"/p/{slug}/datasets/"),
    ]
    results = []
    for name, url in pages:
        status = client.get(url).status_code  # warm caches once
        timings = []
        for _ in range(requests):
            started = time.perf_counter()
            response = client.get(url)
            if response.streaming:
                b"".join(response.streaming_content)  # a stream's time is the whole body's
            timings.append((time.perf_counter() - started) * 1000)
            status = response.status_code
        timings.sort()
        p95 = timings[max(0, int(round(0.95 * len(timings))) - 1)]
        results.append((name, statistics.median(timings), p95, status))
        print(f"  {name}: p95 {p95:.1f} ms", flush=True)
    return results


def seeded_again() -> dict:
    """What ``seed`` returned, read back from a database it filled (--reuse)."""
    from django.contrib.auth import get_user_model

    from dashboard.accounts.models import Project
    from dashboard.observatory.models import CompressionEvent, Conversation, Round, ToolExecution

    project = Project.objects.get(slug="bench")
    first, second = Conversation.objects.filter(project=project).order_by("id").values_list("id", flat=True)[:2]
    seeded_round = Round.objects.filter(conversation_id=second).order_by("index").first()
    return {
        "user": get_user_model().objects.get(username="bench"), "project": project, "conversation": first,
        "execution": ToolExecution.objects.filter(conversation_id=first).first().pk,
        "compression": CompressionEvent.objects.filter(conversation_id=first).first().pk, "trace": "ab" * 16,
        "compare": [Conversation.objects.get(project=project, external_id=f"compare-{side}").pk for side in (1, 2)],
        "seeded_trace": seeded_round.trace_id or "ab" * 16, "round": seeded_round.pk,
    }


def retention_day_drop(seeded: dict) -> str:
    """Drop the oldest full day of spans the way the daily purge does
    (spans_partitions_drop, with the project's retention set so that day is the
    newest one past it), timed; the days before it (empty or partial) go first."""
    from django.db import connection

    from dashboard.observatory import partitions
    from dashboard.observatory.models import Span
    from dashboard.tuning.models import RetentionPolicy

    if not partitions.spans_partitioned():
        return "spans are not partitioned here (SQLite keeps row deletes): nothing to time"
    days = partitions.span_day_partitions()
    sizes = {}
    with connection.cursor() as cursor:
        for day, name in days.items():
            cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(name)}")
            sizes[day] = cursor.fetchone()[0]
    day = min(day for day, size in sizes.items() if size >= max(sizes.values()) / 2)
    now = datetime.now(timezone.utc)
    span_days = (now.date() - day).days - 1  # so `day` is the newest day past retention
    policy, _ = RetentionPolicy.objects.get_or_create(project=seeded["project"])
    policy.span_days = span_days + 1  # first the older days (their own drops are not the figure)
    policy.save()
    older = partitions.spans_partitions_drop(now=now)
    policy.span_days = span_days
    policy.save()
    started = time.perf_counter()
    dropped = partitions.spans_partitions_drop(now=now)
    seconds = time.perf_counter() - started
    return (f"{dropped} ({sizes[day]:,} spans) dropped in {seconds * 1000:.0f} ms; {len(older)} older day(s) "
            f"dropped before; {Span.objects.count():,} spans left")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=5_000)
    parser.add_argument("--tool-executions", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per conversation")
    parser.add_argument("--requests", type=int, default=20, help="requests per page")
    parser.add_argument("--real-totals", action="store_true",
                        help="recompute conversation totals with the real derivation (slow on 100k)")
    parser.add_argument("--db-url", default="", help="postgres://... (default: SQLite in a temp data dir)")
    parser.add_argument("--compare-rounds", type=int, default=200, help="rounds of each compared conversation")
    parser.add_argument("--spans", type=int, default=0,
                        help="seed about this many spans for the conversations (0: one trace of 60)")
    parser.add_argument("--reuse", action="store_true",
                        help="--db-url only: measure the database an earlier run seeded (no seeding)")
    parser.add_argument("--data-dir", default="",
                        help="SQLite: seed into this directory and keep it; the same command again measures "
                             "what it holds without seeding (it must have been seeded with the same options)")
    parser.add_argument("--retention", action="store_true",
                        help="PostgreSQL: after the pages, drop one day of spans as the daily purge does, timed")
    parser.add_argument("--scores", type=int, default=0,
                        help="seed this many scores on the rounds, tool calls and conversations (0: none)")
    parser.add_argument("--csv-rows", type=int, default=0,
                        help="stream a CSV of this many tool calls and report the memory it took (0: skip)")
    args = parser.parse_args()
    if args.data_dir and args.db_url:
        parser.error("--data-dir keeps a SQLite database; with --db-url use --reuse")
    seeding = {name: getattr(args, name) for name in (
        "conversations", "tool_executions", "rounds", "real_totals", "compare_rounds", "spans", "scores")}
    kept = Path(args.data_dir) / "bench-pages-seeded.json" if args.data_dir else None
    if kept is not None and kept.exists():
        if json.loads(kept.read_text()) != seeding:
            parser.error(f"{args.data_dir} was seeded with other options: {kept.read_text()}")
        args.reuse = True
    elif kept is not None:
        Path(args.data_dir).mkdir(parents=True, exist_ok=True)

    with (contextlib.nullcontext(args.data_dir) if args.data_dir
          else tempfile.TemporaryDirectory(prefix="bench-pages-")) as data_dir:
        setup_django(args.db_url, data_dir)
        from django.db import connection

        if not args.reuse:
            print(f"Seeding {connection.vendor}: {args.conversations:,} conversations, "
                  f"{args.tool_executions:,} tool executions, {args.spans:,} spans", flush=True)
        started = time.perf_counter()
        if args.reuse and (args.db_url or kept is not None):
            seeded = seeded_again()
            print("Reusing the seeded database", flush=True)
        else:
            seeded = seed(args.conversations, args.tool_executions, args.rounds, args.real_totals,
                          args.compare_rounds, args.spans)
            artifacts(seeded["project"])
            if args.scores:
                scores_started = time.perf_counter()
                seed_scores(seeded["project"], args.scores)
                print(f"  {args.scores:,} scores: {time.perf_counter() - scores_started:.1f} s", flush=True)
            print(f"Seeded in {time.perf_counter() - started:.1f} s; {args.requests} requests per page\n", flush=True)
            if kept is not None:  # (written last: a seeding cut short is never measured)
                kept.write_text(json.dumps(seeding))
        results = measure(seeded, args.requests)
        width = max(len(name) for name, *_ in results)
        print(f"{'page':<{width}}  {'p50 ms':>8}  {'p95 ms':>8}  status")
        for name, p50, p95, status in results:
            flag = "" if p95 < 100 else "  (over 100 ms)"
            print(f"{name:<{width}}  {p50:8.1f}  {p95:8.1f}  {status}{flag}")
        if args.retention:
            print("\nRetention of one day of spans (partition drop):", flush=True)
            print("  " + retention_day_drop(seeded), flush=True)
        if args.csv_rows:
            print(f"\nCSV stream of {args.csv_rows:,} tool calls:", flush=True)
            memory = csv_stream_memory(seeded, args.csv_rows)
            print(f"  {memory['rows']:,} rows, {memory['bytes'] / 2**20:.0f} MiB in {memory['seconds']:.1f} s "
                  f"({memory['rows'] / memory['seconds']:,.0f} rows/s); resident memory "
                  f"{memory['rss_before'] / 2**20:.0f} MiB before, grew by {memory['rss_growth'] / 2**20:.1f} MiB")
        if args.db_url:
            print("\n(the PostgreSQL tables were left in place; drop the database to clean up)")


if __name__ == "__main__":
    main()
