"""Agent-facing endpoints under /api/v1 (API key auth):

- ``POST /records``: a JSON batch of pipeline records, validated one by one with
  ``pipeline.parse_record``, stored whole in one transaction, derived after commit;
- ``PUT /artifacts/{artifact_id}``: artifact bytes, hash-checked, streamed to storage;
- ``GET /config``: the project's effective config with a strong ETag.

Views are thin: bound, parse, call a service, answer. Errors are raised and mapped
to responses in ``dashboard.api``.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Router, Schema, Status
from ninja.security.http import HttpAuthBase
from pydantic import TypeAdapter

from dashboard import converters  # noqa: F401  (registers artifact_id)
from dashboard.accounts.models import Project
from dashboard.observatory.derive.notes import derivations_enqueue
from dashboard.observatory.models import IngestTransport
from dashboard.observatory.services import StoreOutcome, artifact_store, records_store
from dashboard.priority import yield_to_pages
from dashboard.tuning.services import config_body_and_etag, effective_config
from pipeline import IngestResponse, Record, RecordSchemaError, parse_record

from .common import (
    BodyReader,
    batch_body,
    content_type_required,
    IngestBatch,
    GunzipReader,
    IngestError,
    authenticate,
    derivations_keep_up,
    ingest_gate,
    json_decode_cost,
    load_json,
    memory_reserve,
    timestamp_bounds,
)
from .group_commit import ingest_write

RECORDS_JSON_DEPTH = 32
SHA256_PATTERN = re.compile(r"^[0-9a-fA-F]{64}$")
CONTENT_TYPE_PATTERN = re.compile(r"^[A-Za-z0-9!#$&^_.+-]{1,64}/[A-Za-z0-9!#$&^_.+-]{1,64}(\s*;[ -~]{0,120})?$")
ERROR_LENGTH = 300
_YIELD_EVERY = 100  # records validated between two chances for a page to take the CPU




class ApiKeyAuth(HttpAuthBase):
    """``Authorization: Bearer po_…``: the key's project becomes ``request.auth``."""

    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> Any:
        return authenticate(request)


api_key = ApiKeyAuth()
router = Router(tags=["ingest"], auth=api_key)


class ErrorOut(Schema):
    error: str


# What a batch endpoint (records, scores, dataset items) may answer instead of 200.
BATCH_REFUSALS = {status: ErrorOut for status in (400, 401, 413, 415, 429, 500, 503)}


class ArtifactOut(Schema):
    artifact_id: str
    sha256: str
    size: int
    content_type: str


# --- records ------------------------------------------------------------------------

def _records_body_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The request body schema (the pipeline's Record union) and its definitions,
    which ``dashboard.api`` publishes under components/schemas."""
    schema = TypeAdapter(Record).json_schema(ref_template="#/components/schemas/{model}")
    definitions = schema.pop("$defs", {})
    body = {
        "type": "object",
        "required": ["records"],
        "properties": {
            "records": {
                "type": "array",
                "maxItems": settings.OBSERVATORY_MAX_RECORDS_PER_BATCH,
                "items": schema,
            }
        },
    }
    return body, definitions


_BODY_SCHEMA, RECORD_SCHEMA_DEFINITIONS = _records_body_schema()


@router.post(
    "/records",
    response={200: IngestResponse, **BATCH_REFUSALS},
    summary="Send a batch of records",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _BODY_SCHEMA}},
            "description": "Optionally `Content-Encoding: gzip`. Each record is validated on its own; "
            "invalid ones are listed in `rejected`, the valid ones stored in one transaction.",
        }
    },
)
def post_records(request: HttpRequest) -> dict[str, Any]:
    project = request.auth  # type: ignore[attr-defined]
    content_type_required(request, ("application/json",), "send the records as application/json")
    batch = IngestBatch(IngestTransport.RECORDS, project_id=project.pk, item_name="records")
    with ingest_gate(batch):
        derivations_keep_up()
        body = batch_body(request, batch)
        items = _record_items(load_json(body, max_depth=RECORDS_JSON_DEPTH))
        batch.items = len(items)
        memory_reserve(json_decode_cost(body), "the records")  # the validated models
        valid, rejected = records_validate(items)
        received_from = timezone.now()  # before the rows are stamped received
        outcome = ingest_write(lambda: _records_write(project, valid, received_from), len(valid))
    return {"accepted": outcome.accepted, "duplicates": outcome.duplicates, "rejected": rejected}


def _records_write(project: Project, valid: list[Any], received_from: datetime) -> StoreOutcome:
    """The batch's writes, inside the (group) transaction: may run twice (see ingest.group_commit)."""
    outcome = records_store(project=project, records=valid)
    derivations_enqueue(
        project_id=project.pk, conversation_ids=outcome.conversation_ids, minutes=outcome.tool_minutes,
        rows_from=received_from,
    )
    return outcome


def records_validate(items: list[Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """The valid records of a batch and the refusals by index.

    One ``parse_record`` per record: measured against one pydantic pass over the
    whole list (TypeAdapter(list[Record])), which saved about 5% of validation
    (under 1% of a request) and would need this loop anyway to say which records
    were refused, so the simple form stays.
    """
    valid, rejected = [], []
    earliest, latest = timestamp_bounds()
    for index, item in enumerate(items):
        if index % _YIELD_EVERY == 0:
            yield_to_pages()
        try:
            record = parse_record(item)
            _check_times(record, earliest, latest)
            valid.append(record)
        except (RecordSchemaError, ValueError, TypeError) as exc:
            rejected.append({"index": index, "error": str(exc)[:ERROR_LENGTH]})
    return valid, rejected



def _check_times(record: Any, earliest: datetime, latest: datetime) -> None:
    for name in type(record).model_fields:
        value = getattr(record, name)
        # Aware datetimes compare across offsets without converting, so no overflow here.
        if isinstance(value, datetime) and not earliest <= value < latest:
            raise ValueError(f"{name} is outside {earliest.year}..{latest.year - 1}")


def _record_items(data: Any) -> list[Any]:
    if not isinstance(data, dict):
        raise IngestError(400, "body must be a JSON object")
    items = data.get("records")
    if not isinstance(items, list):
        raise IngestError(400, 'body needs a "records" list')
    limit = settings.OBSERVATORY_MAX_RECORDS_PER_BATCH
    if len(items) > limit:
        raise IngestError(413, f"too many records in one batch (at most {limit})")
    return items


# --- artifacts ----------------------------------------------------------------------

@router.put(
    "/artifacts/{artifact_id:artifact_id}",
    response={200: ArtifactOut, 201: ArtifactOut, 400: ErrorOut, 401: ErrorOut, 409: ErrorOut,
              411: ErrorOut, 413: ErrorOut, 415: ErrorOut, 429: ErrorOut, 500: ErrorOut, 503: ErrorOut},
    summary="Upload an artifact's bytes",
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        "parameters": [
            {"name": "X-Content-SHA256", "in": "header", "required": True,
             "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
        ],
    },
)
def put_artifact(request: HttpRequest, artifact_id: str) -> Status:
    project = request.auth  # type: ignore[attr-defined]
    sha256 = request.headers.get("X-Content-SHA256", "").strip()
    if not SHA256_PATTERN.match(sha256):
        raise IngestError(400, "X-Content-SHA256 must be the body's sha256 as 64 hex characters")
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip"):
        raise IngestError(415, "unsupported Content-Encoding (use gzip or identity)")
    if not request.headers.get("Content-Length"):
        raise IngestError(411, "Content-Length required")
    max_bytes = settings.OBSERVATORY_MAX_ARTIFACT_BYTES
    body = BodyReader(request, max_bytes=max_bytes)  # a cut body stores nothing; a slow one is a 408
    content_type = request.headers.get("Content-Type", "").strip() or "application/octet-stream"
    if not CONTENT_TYPE_PATTERN.match(content_type):
        raise IngestError(400, "invalid Content-Type")
    # The hash and the size limit apply to the artifact itself, after any gzip.
    stream = GunzipReader(body) if encoding in ("gzip", "x-gzip") else body
    with ingest_gate(IngestBatch(IngestTransport.ARTIFACTS, project_id=project.pk, items=1, item_name="artifact",
                           nbytes=body.length)), body:
        outcome = artifact_store(
            project=project, artifact_id=artifact_id, stream=stream, sha256=sha256,
            content_type=content_type, max_bytes=max_bytes,
        )
    artifact = outcome.artifact
    return Status(201 if outcome.created else 200, {
        "artifact_id": artifact.artifact_id, "sha256": artifact.sha256,
        "size": artifact.size, "content_type": artifact.content_type,
    })


# --- config -------------------------------------------------------------------------

@router.get(
    "/config",
    response={200: dict, 304: None, 401: ErrorOut},
    summary="The effective config for the key's project (pipeline ConfigPayload)",
)
def get_config(request: HttpRequest) -> HttpResponse:
    payload = effective_config(project=request.auth)  # type: ignore[attr-defined]
    body, etag = config_body_and_etag(payload)
    if _etag_matches(request.headers.get("If-None-Match", ""), etag):
        response = HttpResponse(status=304)
    else:
        response = HttpResponse(body, content_type="application/json")
    response["ETag"] = etag
    response["Cache-Control"] = "no-cache"
    return response


def _etag_matches(header: str, etag: str) -> bool:
    """If-None-Match uses the weak comparison (RFC 9110 13.1.2)."""
    if not header:
        return False
    if header.strip() == "*":
        return True
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return etag in tags
