"""``POST /v1/traces``: OTLP/HTTP span ingest.

Thin on purpose: check the method and the content type, then (inside the
concurrency gate) authenticate, read the bounded body, decode, store, answer.
Answers are in the request's encoding, as OTLP/HTTP asks: an
ExportTraceServiceResponse on success (with ``partial_success`` when some spans
were rejected) and a ``google.rpc.Status`` on every 4xx/5xx; only a request whose
encoding we do not know (405, 415) is answered in plain text.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from .common import IngestError, authenticate, error_response, ingest_gate, read_body
from .otlp import (
    CONTENT_TYPES,
    OtlpDecodeError,
    OtlpTooManySpans,
    decode_request,
    encode_export_response,
    encode_status,
)
from .spans import spans_store


@csrf_exempt
def export_traces(request: HttpRequest) -> HttpResponse:
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
        with ingest_gate():
            project = authenticate(request)
            body = read_body(
                request,
                max_bytes=settings.OBSERVATORY_MAX_BODY_BYTES,
                max_decoded_bytes=settings.OBSERVATORY_MAX_DECODED_BYTES,
            )
            try:
                batch = decode_request(body, content_type)
            except OtlpTooManySpans as exc:
                raise IngestError(413, str(exc)) from None
            except OtlpDecodeError as exc:
                raise IngestError(400, str(exc)) from None
            spans_store(project=project, spans=batch.spans)
    except IngestError as exc:
        return error_response(
            exc, content_type=content_type, body=encode_status(exc.status, exc.message, content_type)
        )
    return HttpResponse(encode_export_response(batch, content_type), content_type=content_type)
