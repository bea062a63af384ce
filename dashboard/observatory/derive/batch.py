"""What the passes share: the batch of notes a drainer derives, and the form of a pass.

A ``Batch`` is the union of the notes of one project that a drainer claimed: the
conversations, traces, artifacts, minutes and hours they name, and when their rows
were received (``since``..``until``). Each pass reads the batch, derives from rows in
the database, and may widen the batch for the passes after it (the links pass adds
the conversations that gained spans; the span-row pass adds the minutes whose tool
rows it changed). A pass is a function of the rows and the batch: run twice, it
writes the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable


@dataclass
class Batch:
    project_id: int
    conversation_ids: set[int] = field(default_factory=set)
    trace_ids: set[str] = field(default_factory=set)  # traces with spans that may wait for a conversation
    artifact_ids: set[str] = field(default_factory=set)
    hours: set[datetime] = field(default_factory=set)  # tool rollups recomputed whole
    minutes: set[datetime] = field(default_factory=set)  # tool rollups and slices of these minutes
    since: datetime | None = None  # the rows these notes' batches brought were received from …
    until: datetime | None = None  # … to; None: every row of the conversations (a rebuild)
    linked_traces: set[str] = field(default_factory=set)  # traces whose spans the links pass linked (late)
    # conversations of notes no ingest request wrote (a reprice, a re-sum): their
    # per-round figures are derived whole, not only for what the window brought
    whole: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Pass:
    """A named derivation: what it reads and writes (model names, for the reader and
    the docs), and ``run(batch)``."""

    name: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    run: Callable[[Batch], None]


def received_window(since: datetime | None, until: datetime | None) -> dict[str, datetime] | None:
    """The filter on received_at for the rows some batches brought (``until``
    optional); None without ``since``: every row."""
    if since is None:
        return None
    return {"received_at__gte": since, **({"received_at__lte": until} if until else {})}
