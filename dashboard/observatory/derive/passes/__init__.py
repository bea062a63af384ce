"""The derivation passes, one module each, in the order a drainer runs them.

    links -> span_rows -> log_messages -> totals -> rollups

- ``links``: spans, tool executions, artifacts and log records joined to their
  conversation and to each other; widens the batch by the conversations that gained
  spans and the traces linked late.
- ``span_rows``: rounds, messages and tool executions derived from the model-call
  and tool spans of the batch's conversations; widens the batch by the minutes whose
  tool rows changed.
- ``log_messages``: the messages a model call sent as log events (GenAI events tied
  to its span) put on the round ``span_rows`` derived from that span.
- ``totals``: conversation totals, minute slices, round context and costs, hourly usage.
- ``rollups``: tool statistics of the minutes (and hours) the batch touched.

Each is a function of rows in the database and the batch, safe to run twice. No pass
imports the drainer, ingest or the scheduler; docs/derivations.md draws the picture.
"""

from . import links, log_messages, rollups, span_rows, totals

PASSES = (links.PASS, span_rows.PASS, log_messages.PASS, totals.PASS, rollups.PASS)

__all__ = ["PASSES"]
