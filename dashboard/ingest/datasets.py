"""``GET`` and ``POST /api/v1/datasets/{name}/items`` (API key auth): a dataset's
items as JSON Lines (``pipeline.DatasetItem``), for an agent's test suite to replay
(``pipeline.fetch_dataset``), and JSON Lines added to one (``pipeline.send_dataset``;
the dataset is made when new).

A POST is all or nothing: every line is validated first and one bad line refuses the
request (400, naming the line), so a file is never half imported; a line whose
``item_id`` the dataset holds already is counted, not stored again. The number of
lines is bounded before any is parsed (413).
"""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Router, Schema

from dashboard.judging.models import Dataset
from dashboard.judging.selectors import dataset_lines
from dashboard.judging.services import (
    DatasetRefused,
    DatasetTooLarge,
    dataset_create,
    dataset_import,
    dataset_lines_parse,
)
from dashboard.observatory.models import IngestTransport

from .api import BATCH_REFUSALS, ErrorOut, api_key
from .common import IngestBatch, IngestError, batch_body, content_type_required, ingest_gate, memory_reserve
from .group_commit import ingest_write

router = Router(tags=["datasets"], auth=api_key)
MAX_ITEMS_PER_REQUEST = 10_000
NAME = re.compile(r"^[^\x00-\x1f\x7f/]{1,100}$")
JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines", "application/x-jsonlines")


class ImportOut(Schema):
    added: int
    duplicates: int


def _name(name: str) -> str:
    if not NAME.match(name):
        raise IngestError(400, "a dataset name is 1 to 100 characters, no control characters or slashes")
    return name


@router.get("/datasets/{name}/items", response={200: None, 400: ErrorOut, 401: ErrorOut, 404: ErrorOut},
            summary="A dataset's items as JSON Lines")
def get_dataset_items(request: HttpRequest, name: str) -> StreamingHttpResponse:
    dataset = Dataset.objects.filter(project=request.auth, name=_name(name)).first()  # type: ignore[attr-defined]
    if dataset is None:
        raise IngestError(404, "no such dataset")
    response = StreamingHttpResponse(dataset_lines(dataset), content_type="application/x-ndjson")
    response["Content-Disposition"] = 'attachment; filename="dataset.jsonl"'
    return response


@router.post("/datasets/{name}/items",
             response={200: ImportOut, **BATCH_REFUSALS},
             summary="Add JSON Lines of items to a dataset (made when new)",
             openapi_extra={"requestBody": {"required": True, "content": {"application/x-ndjson": {
                 "schema": {"type": "string", "description": "one pipeline DatasetItem (JSON) a line"}}}}})
def post_dataset_items(request: HttpRequest, name: str) -> dict[str, Any]:
    project = request.auth  # type: ignore[attr-defined]
    name = _name(name)
    content_type_required(request, JSONL_TYPES, "send the items as application/x-ndjson (one JSON item a line)")
    batch = IngestBatch(IngestTransport.API, project_id=project.pk, item_name="dataset items")
    with ingest_gate(batch):
        body = batch_body(request, batch)
        items = jsonl_items(body)
        batch.items = len(items)

        def write() -> tuple[int, int]:
            dataset = Dataset.objects.filter(project=project, name=name).first()
            if dataset is None:
                try:
                    dataset = dataset_create(project=project, name=name, user=None)
                except DatasetRefused as exc:  # made by a concurrent request: its own transaction saw it
                    raise IngestError(409, str(exc)) from None
            return dataset_import(dataset=dataset, items=items)

        added, duplicates = ingest_write(write, len(items))
    return {"added": added, "duplicates": duplicates}


def jsonl_items(body: bytes) -> list[Any]:
    """Every line of a JSONL body as a pipeline DatasetItem (``dataset_lines_parse``),
    its refusal as the answer's."""
    memory_reserve(3 * len(body), "the dataset items")
    try:
        return dataset_lines_parse(body, limit=MAX_ITEMS_PER_REQUEST)
    except DatasetTooLarge as exc:
        raise IngestError(413, str(exc)) from None
    except DatasetRefused as exc:
        raise IngestError(400, str(exc)) from None
