"""What several observatory tests share."""

from __future__ import annotations

from dashboard.observatory.services import StoreOutcome, records_store
from pipeline import parse_record


def store(project, batch: list[dict]) -> StoreOutcome:
    """Store a batch of records as the JSON an agent sends (``records`` fixture dicts)."""
    return records_store(project=project, records=[parse_record(item) for item in batch])
