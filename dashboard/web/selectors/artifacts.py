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

from django.db.models import OuterRef, Q, Subquery, TextField
from django.db.models.functions import Cast

from dashboard.accounts.models import Project
from dashboard.observatory.models import Artifact, ToolExecution
from dashboard.observatory.selectors import artifacts_for_project, download_type

PAGE_SIZE = 50
READERS_SHOWN = 50  # the tool calls that read an artifact back, listed on its page at most
PREVIEW_BYTES = 256 * 1024
CSV_PREVIEW_ROWS = 200


def artifact_list(
    project: Project, *, before_id: Optional[int] = None, page_size: Optional[int] = None
) -> tuple[list[Artifact], Optional[int]]:
    """Newest first, keyset by id (ids grow with created_at for uploads); each with
    the tool that produced it (``producer_tool``: one probe of toolexec_project_artifact)."""
    page_size = page_size or PAGE_SIZE
    qs = (
        artifacts_for_project(project)
        .select_related("conversation")
        .only(
            "id", "artifact_id", "size", "content_type", "created_at", "expires_at",
            "conversation__id", "conversation__title", "conversation__external_id",
        )
        .annotate(producer_tool=Subquery(_naming(OuterRef("project_id"), OuterRef("artifact_id"))
                                         .values("tool_name")[:1]))
        .order_by("-id")
    )
    if before_id is not None:
        qs = qs.filter(id__lt=before_id)
    rows = list(qs[: page_size + 1])
    next_before = rows[page_size - 1].id if len(rows) > page_size else None
    return rows[:page_size], next_before


def _naming(project_id: Any, artifact_id: Any) -> Any:
    """The tool executions whose result names the artifact, first first: the first
    produced it; a later one (a tool that read it back: artifacts are
    content-addressed, so its result is the same artifact) is a reader."""
    return ToolExecution.objects.filter(project_id=project_id, artifact_id=artifact_id).exclude(
        artifact_id="").order_by("occurred_at", "id")


@dataclass
class Provenance:
    producer: Optional[ToolExecution]  # None: no tool call names it (yet)
    readers: list[ToolExecution]
    more_readers: bool  # more than READERS_SHOWN


def artifact_provenance(artifact: Artifact) -> Provenance:
    """Who produced the artifact and who read it back: the tool calls after the
    producer that name it in their result, or in their arguments (file_reader's
    {"name": "artifact_…"}) in the producer's conversation. At most READERS_SHOWN."""
    fields = ("id", "tool_name", "occurred_at", "conversation_id", "round_id", "tool_call_id")
    naming = _naming(artifact.project_id, artifact.artifact_id).only(*fields)
    producer = naming.first()
    if producer is None:
        return Provenance(producer=None, readers=[], more_readers=False)
    in_result = Q(project_id=artifact.project_id, artifact_id=artifact.artifact_id) & ~Q(artifact_id="")
    in_arguments = Q(conversation_id=producer.conversation_id, occurred_at__gte=producer.occurred_at,
                     arguments__contains=artifact.artifact_id)
    readers = list(
        ToolExecution.objects.alias(arguments=Cast("parameters", TextField()))
        .filter(in_result | in_arguments).exclude(pk=producer.pk)
        .order_by("occurred_at", "id").only(*fields)[: READERS_SHOWN + 1]
    )
    return Provenance(producer=producer, readers=readers[:READERS_SHOWN], more_readers=len(readers) > READERS_SHOWN)


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
