"""``POST /v1/traces``, ``/v1/logs`` and ``/v1/metrics``: OTLP/HTTP span, log and metric ingest.

Thin on purpose: check the method and the content type, then hand the
Authorization header and a bounded body reader to ``otlp_export`` (the store path
shared with OTLP/gRPC) and turn what it returns into an answer. Answers are in the
request's encoding, as OTLP/HTTP asks: an Export*ServiceResponse on success (with
``partial_success`` when some items were rejected) and a ``google.rpc.Status`` on
every 4xx/5xx; only a request whose encoding we do not know (405, 415) is
answered in plain text. Bodies may come chunked (no Content-Length): see
``read_body``.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from .common import IngestError, error_response, read_body
from .export import LOGS, METRICS, TRACES, otlp_export
from .otlp import CONTENT_TYPES, encode_status


@csrf_exempt
def export_traces(request: HttpRequest) -> HttpResponse:
    return _export(request, TRACES)


@csrf_exempt
def export_logs(request: HttpRequest) -> HttpResponse:
    return _export(request, LOGS)


@csrf_exempt
def export_metrics(request: HttpRequest) -> HttpResponse:
    return _export(request, METRICS)


def _export(request: HttpRequest, signal: str) -> HttpResponse:
    if request.method != "POST":
        response = HttpResponse("use POST\n", status=405, content_type="text/plain")
        response["Allow"] = "POST"
        return response
    content_type = (request.content_type or "").lower()
    if content_type not in CONTENT_TYPES:
        return HttpResponse(
            "unsupported content type; send application/x-protobuf or application/json\n",
            status=415,
            content_type="text/plain",
        )
    try:
        outcome = otlp_export(
            signal=signal,
            authorization=request.headers.get("Authorization", ""),
            read_body=lambda: read_body(
                request,
                max_bytes=settings.OBSERVATORY_MAX_BODY_BYTES,
                max_decoded_bytes=settings.OBSERVATORY_MAX_DECODED_BYTES,
            ),
            content_type=content_type,
        )
    except IngestError as exc:
        return error_response(
            exc, content_type=content_type, body=encode_status(exc.status, exc.message, content_type), request=request
        )
    return HttpResponse(outcome.response(content_type), content_type=content_type)
