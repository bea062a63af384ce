"""OTLP spans for the judging tests, sent through the real ingest path and outbox
(the builders of the span-row tests)."""

from __future__ import annotations

from tests.dashboard.observatory.test_span_rows import agent_spans, send, span

TRACE = "ab" * 16
LLM0, TOOL, LLM1 = "2" * 16, "3" * 16, "4" * 16

__all__ = ["LLM0", "LLM1", "TOOL", "TRACE", "agent_spans", "send", "span"]
