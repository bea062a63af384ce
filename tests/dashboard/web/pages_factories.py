"""Builders for the page tests: conversations stored through the real ingest path
(pipeline records -> records_store) with the real derivations (conversation totals,
hourly rollups, links), so the pages read what production would have written."""

from __future__ import annotations

import hashlib
import io
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from django.db import transaction

from dashboard.observatory import services
from dashboard.observatory.derive.passes import links, rollups, totals
from dashboard.observatory.models import Span
from pipeline import parse_record

HOUR = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
PASSWORD = "correct horse battery staple"


def store(project: Any, records: list[dict[str, Any]]) -> services.StoreOutcome:
    """Ingest records as the records endpoint does, then run the derivations the
    tasks would run after commit."""
    parsed = [parse_record(r) for r in records]
    with transaction.atomic():
        outcome = services.records_store(project=project, records=parsed)
    links.links_refresh(project_id=project.pk, conversation_ids=outcome.conversation_ids)
    totals.conversation_totals_refresh(conversation_ids=outcome.conversation_ids)
    rollups.tool_rollups_refresh(project_id=project.pk, minutes=outcome.tool_minutes)
    return outcome


def tool_record(
    conversation_id: str,
    *,
    tool: str = "query_sales",
    round_id: Optional[str] = None,
    at: datetime = HOUR,
    success: bool = True,
    duration_ms: float = 120.0,
    level: str = "standard",
    observation: Optional[str] = None,
    tokens: dict[str, int] | None = None,
    retries: int = 0,
    cache_hit: bool = False,
    error_type: Optional[str] = None,
    artifact_id: Optional[str] = None,
    trace_id: Optional[str] = None,
    span_id: Optional[str] = None,
    parameters: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    tokens = tokens or {"brief": 10, "standard": 40, "full": 400}
    texts = {
        "brief": f"{tool}: 3 rows",
        "standard": f"{tool}: 3 rows; region=north total=12",
        "full": f"{tool}: full table\nregion,total\nnorth,12",
    }
    seen = observation if observation is not None else texts[level]
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    return {
        "type": "tool_result",
        "record_id": str(uuid.uuid4()),
        "conversation_id": conversation_id,
        "occurred_at": at.isoformat(),
        "round_id": round_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "tool_name": tool,
        "parameters": parameters if parameters is not None else {"region": "north"},
        "model": "gpt-4o",
        "result": {
            "tool_call_id": call_id,
            "observation": seen,
            "output_level": level,
            "success": success,
            "duration_ms": duration_ms,
            "observation_tokens": tokens[level],
            "retry_count": retries,
            "cache_hit": cache_hit,
            "artifact_id": artifact_id,
            "error_type": error_type if not success else None,
            "error_code": "E_TIMEOUT" if error_type == "timeout" else None,
            "error_message": f"{tool} failed" if not success else None,
        },
        "renderings": [
            {"level": lv, "observation": texts[lv] if lv != level else seen, "tokens": tokens[lv]}
            for lv in ("brief", "standard", "full")
        ],
    }


def round_record(
    conversation_id: str,
    index: int,
    *,
    at: datetime = HOUR,
    user_message: str = "What were sales in the north?",
    final_answer: Optional[str] = "Sales were 12.",
    context_tokens: int = 1000,
    trace_id: Optional[str] = None,
    status: str = "ok",
    model: str = "gpt-4o",
    user_id: str = "user-1",
) -> dict[str, Any]:
    return {
        "type": "round",
        "record_id": str(uuid.uuid4()),
        "conversation_id": conversation_id,
        "occurred_at": at.isoformat(),
        "round_id": f"{conversation_id}-r{index}",
        "index": index,
        "trace_id": trace_id,
        "model": model,
        "user_id": user_id,
        "user_message": user_message,
        "thoughts": ["I should query the sales table."],
        "final_answer": final_answer,
        "status": status,
        "context_tokens": context_tokens,
        "context_window": 8000,
        "compression_threshold": 0.8,
        "input_tokens": 900,
        "output_tokens": 100,
        "started_at": at.isoformat(),
        "ended_at": (at + timedelta(seconds=2)).isoformat(),
    }


def compression_record(conversation_id: str, round_id: str, *, at: datetime = HOUR) -> dict[str, Any]:
    return {
        "type": "compression",
        "record_id": str(uuid.uuid4()),
        "conversation_id": conversation_id,
        "occurred_at": at.isoformat(),
        "round_id": round_id,
        "result": {
            "mode": "summarize",
            "model": "gpt-4o",
            "target_tokens": 500,
            "tokens_before": 7000,
            "tokens_after": 450,
            "messages_before": 4,
            "messages_after": 3,
            "target_met": True,
            "changes": [
                {"index": 0, "role": "system", "priority": "critical", "action": "kept",
                 "tokens_before": 50, "tokens_after": 50, "new_index": 0, "content_before": "You are a BA agent."},
                {"index": 1, "role": "user", "priority": "high", "action": "summarized",
                 "tokens_before": 3000, "tokens_after": 0, "summary_id": "sum_1",
                 "content_before": "old question one"},
                {"index": 2, "role": "tool", "priority": "medium", "action": "dropped",
                 "tokens_before": 3000, "tokens_after": 0, "content_before": "a very long tool log"},
                {"index": 3, "role": "assistant", "priority": "medium", "action": "truncated",
                 "tokens_before": 950, "tokens_after": 300, "new_index": 2,
                 "content_before": "long answer " * 20, "content_after": "long answer (cut)"},
            ],
            "summaries": [
                {"summary_id": "sum_1", "text": "The user asked about the north region.",
                 "replaced_indices": [1], "tokens": 100, "new_index": 1},
            ],
            "config": {"strategy": "summarize", "threshold_ratio": 0.8, "target_ratio": 0.5},
        },
    }


def skill_record(conversation_id: str, round_id: str, *, at: datetime = HOUR) -> dict[str, Any]:
    return {
        "type": "skill_activation",
        "record_id": str(uuid.uuid4()),
        "conversation_id": conversation_id,
        "occurred_at": at.isoformat(),
        "round_id": round_id,
        "skill_name": "sales-report",
        "activation_id": f"act_{uuid.uuid4().hex[:8]}",
        "load_level": 2,
        "depth": 1,
        "chain": ["data-cleaning", "sales-report"],
        "tokens_loaded": 321,
    }


def message_record(conversation_id: str, index: int, role: str, content: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "record_id": str(uuid.uuid4()),
        "conversation_id": conversation_id,
        "occurred_at": (HOUR + timedelta(seconds=index)).isoformat(),
        "index": index,
        "role": role,
        "content": content,
        **extra,
    }


def full_conversation(project: Any, conversation_id: str = "conv-1", *, rounds: int = 2,
                      trace_id: str = "ab" * 16) -> dict[str, Any]:
    """A conversation with rounds, tool calls (one failed), a skill activation, a
    compression event and messages. Returns the record dicts by kind."""
    records: dict[str, list[dict[str, Any]]] = {"round": [], "tool": [], "other": []}
    for i in range(rounds):
        at = HOUR + timedelta(minutes=i)
        rid = f"{conversation_id}-r{i}"
        records["round"].append(round_record(conversation_id, i, at=at, trace_id=trace_id if i == 0 else None,
                                             context_tokens=1000 * (i + 1)))
        records["tool"].append(tool_record(conversation_id, round_id=rid, at=at + timedelta(seconds=1)))
        records["tool"].append(tool_record(conversation_id, tool="load_csv", round_id=rid,
                                           at=at + timedelta(seconds=2), success=(i != 0), error_type="timeout",
                                           duration_ms=2500.0, retries=1, level="brief"))
    records["other"].append(skill_record(conversation_id, f"{conversation_id}-r0", at=HOUR + timedelta(seconds=3)))
    records["other"].append(compression_record(conversation_id, f"{conversation_id}-r{rounds - 1}",
                                               at=HOUR + timedelta(minutes=rounds - 1, seconds=5)))
    records["other"].append(message_record(conversation_id, 0, "user", "What were sales in the north?"))
    store(project, records["round"] + records["tool"] + records["other"])
    return records


def add_span(project: Any, trace_id: str, span_id: str, name: str, *, parent: str = "", start_ms: int = 0,
             duration_ms: float = 100.0, attributes: Optional[dict[str, Any]] = None, status_code: int = 0,
             events: Optional[list[Any]] = None, truncated: bool = False, **extra: Any) -> Span:
    start = HOUR + timedelta(milliseconds=start_ms)
    return Span.objects.create(
        project=project, trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name,
        start_time=start, end_time=start + timedelta(milliseconds=duration_ms), duration_ms=duration_ms,
        status_code=status_code, attributes=attributes or {}, events=events or [], truncated=truncated, **extra,
    )


def add_artifact(project: Any, data: bytes, content_type: str = "application/json",
                 artifact_id: Optional[str] = None) -> Any:
    artifact_id = artifact_id or "artifact_" + uuid.uuid4().hex
    outcome = services.artifact_store(
        project=project, artifact_id=artifact_id, stream=io.BytesIO(data),
        sha256=hashlib.sha256(data).hexdigest(), content_type=content_type, max_bytes=10 * 1024 * 1024,
    )
    return outcome.artifact


def price_rule(pattern: str, input_price: str, output_price: str, day: Any = None) -> Any:
    """A price rule (USD per million tokens) in force from ``day`` (long ago by default)."""
    from datetime import date
    from decimal import Decimal

    from dashboard.tuning.models import PriceRule

    return PriceRule.objects.create(pattern=pattern, input_usd_per_million=Decimal(input_price),
                                    output_usd_per_million=Decimal(output_price),
                                    effective_from=day or date(2020, 1, 1))
