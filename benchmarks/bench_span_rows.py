"""Conversations from spans alone: what deriving rounds, messages and tool
executions from OpenInference-shaped spans costs, and that a second pass is cheap.

    .venv/bin/python -m benchmarks.bench_span_rows --conversations 300

A fresh SQLite data dir (or ``--database-url``), in this process. Each conversation
is one trace of an agent run as openinference-instrumentation-langchain sends it:
an AGENT root naming the session, 8 CHAIN spans, 2 LLM spans (messages and
tokens) and 1 TOOL span; stored through the real ingest (``spans_store``) in
batches of 512 spans with the children before the root (as a BatchSpanProcessor
exports them). Then the outbox is drained (late linking by trace, derivation,
totals, rollups) and timed; then the same conversations are derived again (nothing
new: what a later batch of a long conversation pays for the old spans). Printed:
spans, rows derived, seconds and spans/s of the first drain, the second pass's
seconds, and the growth of this process's peak RSS.

``--phases``: where the first drain's CPU goes, in µs a span: each pass of the fixed
order (derive.passes.PASSES and the registered ones), and the span-row pass's own
steps (reading candidates, conventions, inserting, numbering, …), each step's time
without the steps it calls. CPU time of this process, so the figures hold on a busy
machine where wall times do not; py-spy (bench_burst --profile) shows the same
shares, cProfile does not (its per-call cost inflated small functions fourfold).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.load import django_env, setup_django

CHAINS = 8


def agent_run(n: int, start_ns: int) -> list[dict]:
    trace, root = f"{n + 1:032x}", f"{1:016x}"

    def span(index: int, name: str, attributes: dict, parent: str = root) -> dict:
        at = start_ns + index * 10_000_000
        return {"traceId": trace, "spanId": f"{index + 2:016x}" if name != "root" else root,
                "parentSpanId": "" if name == "root" else parent, "name": name,
                "startTimeUnixNano": str(at), "endTimeUnixNano": str(at + 5_000_000),
                "attributes": [{"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
                               for k, v in attributes.items()]}

    spans = [span(i, f"chain {i}", {"openinference.span.kind": "CHAIN", "input.value": "x" * 200})
             for i in range(CHAINS)]
    call = json.dumps([{"role": "assistant", "parts": [{"type": "tool_call", "id": f"call_{n}", "name": "search",
                                                        "arguments": {"q": "orders"}}]}])
    spans.append(span(CHAINS, "llm", {
        "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o", "llm.token_count.prompt": 900,
        "llm.token_count.completion": 40, "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": f"question {n}", "gen_ai.output.messages": call}))
    spans.append(span(CHAINS + 1, "search", {
        "openinference.span.kind": "TOOL", "tool.name": "search", "input.value": "orders",
        "output.value": json.dumps({"type": "tool", "data": {"content": "12 rows", "tool_call_id": f"call_{n}"}})}))
    spans.append(span(CHAINS + 2, "llm", {
        "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o", "llm.token_count.prompt": 1300,
        "llm.token_count.completion": 60, "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": "Twelve orders."}))
    spans.append(span(CHAINS + 3, "root", {"openinference.span.kind": "AGENT", "session.id": f"session-{n}"}))
    return spans


# The span-row pass's steps, timed by --phases (module attributes of derive.passes.span_rows,
# and of the modules it reads through).
SPAN_ROW_STEPS = ("_candidate_chunks", "_records_win", "_rounds_from", "_tools_from", "_renumber", "_calls_by_round",
                  "_assign_rounds", "_used_calls", "_user_from_naming_spans", "span_facts", "record_id",
                  "insert_ignoring_conflicts", "update_rows")
# The totals pass's steps (derive.passes.totals), timed the same way.
TOTALS_STEPS = ("_slices_read", "_conversation_totals_read", "_scoped_rounds", "_slices_write", "_slices_sum",
                "_last_tool_models", "_round_context", "_rounds_tool_counts", "update_rows", "_resum_later")


class Phases:
    """CPU time by named step, each step's own (what the timed steps it calls took is
    theirs). Generators are timed per item."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self._inner: list[float] = []

    def _charge(self, name: str, began: float) -> None:
        spent = time.process_time() - began
        self.seconds[name] += spent - self._inner.pop()
        if self._inner:
            self._inner[-1] += spent

    def wrap(self, name: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            began = time.process_time()
            self._inner.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                self._charge(name, began)
        return timed

    def wrap_generator(self, name: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            items = function(*args, **kwargs)
            while True:
                began = time.process_time()
                self._inner.append(0.0)
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    self._charge(name, began)
                yield item
        return timed


def phases_install(phases: Phases) -> None:
    import dataclasses
    import inspect

    from dashboard.observatory import conventions, rows
    from dashboard.observatory.derive import drain
    from dashboard.observatory.derive.passes import span_rows, totals

    for module, steps in ((span_rows, SPAN_ROW_STEPS), (totals, TOTALS_STEPS)):
        for name in steps:
            function = getattr(module, name)
            wrap = phases.wrap_generator if inspect.isgeneratorfunction(function) else phases.wrap
            setattr(module, name, wrap(f"{module.__name__.rpartition('.')[2]}.{name}", function))
    totals.costs.conversations_priced = phases.wrap("totals.costs.conversations_priced",
                                                    totals.costs.conversations_priced)
    conventions.messages_of = phases.wrap("span_rows.messages_of", conventions.messages_of)
    rows.insert_values_ignoring_conflicts = phases.wrap("span_rows.insert (the SQL)", rows.insert_values_ignoring_conflicts)
    ordered = drain.PASSES + drain.registered_passes()
    timed = tuple(dataclasses.replace(each, run=phases.wrap(f"pass {each.name}", each.run)) for each in ordered)
    drain.PASSES, drain.registered_passes = timed, lambda: ()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--phases", action="store_true", help="where the first drain's CPU goes, µs a span")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-span-rows-"))
    try:
        setup_django(django_env(workdir, args.database_url))
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from dashboard.accounts.services import project_create
        from dashboard.ingest.otlp import decode_json
        from dashboard.ingest.spans import spans_store
        from dashboard.observatory.derive import notes
        from dashboard.observatory.derive.drain import outbox_drain_all
        from dashboard.observatory.derive.passes import span_rows
        from dashboard.observatory.models import Conversation, Message, Round, ToolExecution

        notes._wakers.clear()  # drained below, timed, not by a background thread
        project = project_create(name=f"bench-span-rows-{time.time_ns()}")
        start_ns = time.time_ns() - 3_600_000_000_000
        spans = [s for n in range(args.conversations) for s in agent_run(n, start_ns)]
        for offset in range(0, len(spans), 512):
            body = json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                                  "scopeSpans": [{"spans": spans[offset:offset + 512]}]}]})
            spans_store(project=project, spans=decode_json(body.encode()).spans)
        phases = Phases()
        if args.phases:
            phases_install(phases)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        began, cpu = time.perf_counter(), time.process_time()
        outbox_drain_all(passes=10_000)
        first, cpu = time.perf_counter() - began, time.process_time() - cpu
        spent = collections.Counter(phases.seconds)  # the first drain's (the pass below adds to phases)
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ids = list(Conversation.objects.filter(project=project).values_list("id", flat=True))
        began = time.perf_counter()
        span_rows.span_rows_derive(project_id=project.pk, conversation_ids=ids)
        again = time.perf_counter() - began
        rows = (Round.objects.filter(project=project).count(), Message.objects.filter(project=project).count(),
                ToolExecution.objects.filter(project=project).count())
        print(f"conversations {len(ids)}, spans {len(spans)}; derived rounds {rows[0]}, messages {rows[1]}, "
              f"tool executions {rows[2]}")
        print(f"first drain (link late spans, derive, totals, rollups): {first:.2f} s, "
              f"{len(spans) / first:,.0f} spans/s, {len(ids) / first:,.0f} conversations/s")
        print(f"second derivation pass, nothing new: {again:.2f} s ({again / len(ids) * 1000:.2f} ms a conversation)")
        print(f"peak RSS growth during the drain: {(rss_after - rss_before) / 1024:.1f} MiB")
        if args.phases:
            print(f"first drain's CPU: {cpu * 1e6 / len(spans):.0f} µs a span; by step (own time, µs a span):")
            for name, seconds in spent.most_common():
                print(f"  {name:40s} {seconds * 1e6 / len(spans):7.1f}")
            rest = cpu - sum(spent.values())
            print(f"  {'(the drainer, outside the passes)':40s} {rest * 1e6 / len(spans):7.1f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
