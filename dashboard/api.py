"""The one NinjaAPI: a router per app under /api/v1, docs at /api/docs.

Every exception that can leave a view is mapped to a response here, in one place,
so a client's junk is always a short JSON ``{"error": ...}`` with the right 4xx,
a busy database a 503 with Retry-After, and a broken one a 500 that names nothing
internal (``dashboard.ingest.common.database_refusal``: logged and counted).
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from dashboard.accounts.models import Project
from dashboard.ingest.api import RECORD_SCHEMA_DEFINITIONS
from dashboard.ingest.api import router as ingest_router
from dashboard.ingest.datasets import router as datasets_router
from dashboard.ingest.scores import SCORE_SCHEMA_DEFINITIONS
from dashboard.ingest.scores import router as scores_router
from dashboard.ingest.common import (
    IngestBatch,
    DatabaseBroken,
    IngestError,
    database_broken_report,
    database_refusal,
    error_response,
)
from dashboard.observatory.api import router as read_router
from dashboard.observatory.models import IngestTransport
from dashboard.observatory.services import ArtifactConflict, ArtifactHashMismatch, ArtifactTooLarge
from pipeline import ArtifactNotFound, InvalidArtifactId, PipelineError


class ObservatoryAPI(NinjaAPI):
    """NinjaAPI that also publishes schemas it did not generate itself (the
    pipeline's record models, which the records endpoint validates item by item)."""

    extra_schemas: dict[str, Any] = {}

    def get_openapi_schema(self, *args: Any, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(*args, **kwargs)
        schema.setdefault("components", {}).setdefault("schemas", {}).update(self.extra_schemas)
        return schema


api = ObservatoryAPI(
    title="Pipeline Observatory",
    version="1",
    description="Ingest for agents (records, artifacts, config) and the dashboard's read API.",
    docs_url="/docs",
    urls_namespace="api",
)


def _error(status: int, message: str, retry_after: int | None = None) -> HttpResponse:
    return error_response(IngestError(status, message, retry_after=retry_after))


@api.exception_handler(IngestError)
def _on_ingest_error(request: HttpRequest, exc: IngestError) -> HttpResponse:
    if isinstance(exc, DatabaseBroken):  # reported here if from outside an ingest gate (the key's read)
        database_broken_report(exc, _batch(request))
    return error_response(exc, request=request)


@api.exception_handler(ValidationError)
def _on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    first = exc.errors[0] if exc.errors else {}
    where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "request"
    return _error(400, f"{where}: {first.get('msg', 'invalid')}"[:300])


# Exceptions whose answer is always the same short message.
FIXED_ANSWERS: dict[type[Exception], tuple[int, str]] = {
    AuthenticationError: (401, "authentication required"),
    Http404: (404, "not found"),
    ArtifactNotFound: (404, "artifact not found"),
    InvalidArtifactId: (400, "invalid artifact id"),
    ArtifactConflict: (409, "artifact id already stored with other content"),
    ArtifactHashMismatch: (400, "body does not match X-Content-SHA256"),
    ArtifactTooLarge: (413, "artifact too large"),
}


def _fixed_answer(status: int, message: str) -> Any:
    def handler(request: HttpRequest, exc: Exception) -> HttpResponse:
        return _error(status, message)

    return handler


for _exception, (_status, _message) in FIXED_ANSWERS.items():
    api.add_exception_handler(_exception, _fixed_answer(_status, _message))


@api.exception_handler(PipelineError)
def _on_pipeline_error(request: HttpRequest, exc: PipelineError) -> HttpResponse:
    return _error(400, str(exc)[:300])


@api.exception_handler(DatabaseError)
def _on_database_error(request: HttpRequest, exc: DatabaseError) -> HttpResponse:
    """A database error outside an ingest gate (which answers its own): 503 when the
    database is busy, else 500, logged and counted."""
    return error_response(database_refusal(exc, _batch(request)))


# The ingest endpoints by view name (the others count as IngestTransport.API).
_TRANSPORTS = {"post_records": IngestTransport.RECORDS, "put_artifact": IngestTransport.ARTIFACTS}


def _batch(request: HttpRequest) -> IngestBatch:
    """What is known of a request's batch outside its view: the endpoint and the key's project."""
    match = request.resolver_match
    project = getattr(request, "auth", None)
    return IngestBatch(_TRANSPORTS.get(match.url_name if match else "", IngestTransport.API),
                 project_id=project.pk if isinstance(project, Project) else None)


@api.exception_handler(HttpError)
def _on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return _error(exc.status_code, str(exc)[:300])


# The records body refers to the pipeline's record models: publish them with the schemas
# ninja generates.
api.extra_schemas.update(RECORD_SCHEMA_DEFINITIONS)
api.extra_schemas.update(SCORE_SCHEMA_DEFINITIONS)
api.add_router("/v1/", ingest_router)
api.add_router("/v1/", scores_router)
api.add_router("/v1/", datasets_router)
api.add_router("/v1/", read_router)
