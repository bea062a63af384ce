"""Artifacts pages: the list and a bounded preview (the safe download type and
name are the domain's, shared with the JSON API's download).

The file is reached only through the storage API from the Artifact row; its stored
name is a generated one and never leaves the server.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from dashboard.accounts.models import Project
from dashboard.observatory.models import Artifact
from dashboard.observatory.selectors import artifacts_for_project, download_type

PAGE_SIZE = 50
PREVIEW_BYTES = 256 * 1024
CSV_PREVIEW_ROWS = 200


def artifact_list(
    project: Project, *, before_id: Optional[int] = None, page_size: Optional[int] = None
) -> tuple[list[Artifact], Optional[int]]:
    """Newest first, keyset by id (ids grow with created_at for uploads)."""
    page_size = page_size or PAGE_SIZE
    qs = (
        artifacts_for_project(project)
        .select_related("conversation", "tool_execution")
        .only(
            "id", "artifact_id", "size", "content_type", "created_at", "expires_at",
            "conversation__id", "conversation__title", "conversation__external_id",
            "tool_execution__id", "tool_execution__tool_name",
        )
        .order_by("-id")
    )
    if before_id is not None:
        qs = qs.filter(id__lt=before_id)
    rows = list(qs[: page_size + 1])
    next_before = rows[page_size - 1].id if len(rows) > page_size else None
    return rows[:page_size], next_before


@dataclass
class Preview:
    kind: str  # "json", "csv", "text" or "binary"
    text: str = ""
    rows: list[list[str]] = field(default_factory=list)
    cut: bool = False  # the file is larger than what is shown
    shown_bytes: int = 0
    error: str = ""


def preview(artifact: Artifact) -> Preview:
    """The first PREVIEW_BYTES of the file, as pretty JSON, a CSV table or text."""
    with artifact.file.open("rb") as handle:
        head = handle.read(PREVIEW_BYTES + 1)
    cut = len(head) > PREVIEW_BYTES or artifact.size > PREVIEW_BYTES
    head = head[:PREVIEW_BYTES]
    base_type = download_type(artifact).split(";")[0]
    text = _decode(head)
    if text is None:
        return Preview(kind="binary", cut=cut, shown_bytes=0)
    if base_type == "application/json" or (base_type == "text/plain" and _looks_like_json(text)):
        if not cut:
            try:
                data: Any = json.loads(text)
                return Preview(kind="json", text=json.dumps(data, indent=2, ensure_ascii=False),
                               shown_bytes=len(head))
            except ValueError as exc:
                return Preview(kind="text", text=text, shown_bytes=len(head), error=f"Not valid JSON: {exc}")
        return Preview(kind="text", text=text, cut=True, shown_bytes=len(head))
    if base_type in ("text/csv", "application/csv"):
        reader = csv.reader(io.StringIO(text))
        rows: list[list[str]] = []
        try:
            for row in reader:
                if len(rows) >= CSV_PREVIEW_ROWS:
                    cut = True
                    break
                rows.append(row)
        except csv.Error as exc:
            return Preview(kind="text", text=text, cut=cut, shown_bytes=len(head), error=f"Not valid CSV: {exc}")
        if cut and rows and len(rows) < CSV_PREVIEW_ROWS:
            rows = rows[:-1]  # the last row may be cut mid-line
        return Preview(kind="csv", rows=rows, cut=cut, shown_bytes=len(head))
    return Preview(kind="text", text=text, cut=cut, shown_bytes=len(head))


def _decode(data: bytes) -> Optional[str]:
    """UTF-8 text, tolerating a character cut at the end; None for binary data."""
    if b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(data) - 3:  # a multi-byte character cut by the preview limit
            return data[: exc.start].decode("utf-8", errors="replace")
        return None


def _looks_like_json(text: str) -> bool:
    stripped = text.lstrip()
    return stripped[:1] in ("{", "[")
