"""OTLP/gRPC: ``TraceService/Export``, ``LogsService/Export`` and ``MetricsService/Export`` on their own port.

Run by ``manage.py otlp_grpc`` in processes of their own (4317 on the loopback
interface by default; one process a core sharing the port, SO_REUSEPORT). The services are the official opentelemetry-proto ones
(names from their descriptors); the handlers take the request as raw bytes and
hand them to ``otlp_export``, the store path HTTP uses, so both transports
authenticate, bound, decode and store alike. This module only maps the outcome:

- success: the Export*ServiceResponse, with ``partial_success`` as over HTTP,
  sent after the commit;
- an IngestError: its gRPC status. When the server cannot take the batch now
  (HTTP 429 / 503) the status is RESOURCE_EXHAUSTED / UNAVAILABLE with a
  ``google.rpc.RetryInfo`` in ``grpc-status-details-bin``, which OTLP exporters
  read as "retry after this delay"; a batch too large (413) is RESOURCE_EXHAUSTED
  without RetryInfo, so it is not retried; a batch a broken database failed (500,
  not a busy one: ``database_refusal``) is INTERNAL, which OTLP exporters do not retry.

Bounded: a thread pool of OBSERVATORY_GRPC_THREADS runs the handlers, at most
OBSERVATORY_GRPC_MAX_CONCURRENT_RPCS are accepted at once (gRPC answers
RESOURCE_EXHAUSTED past it), a message may be at most OBSERVATORY_MAX_DECODED_BYTES
once decompressed (gRPC refuses it before our code runs), and the ingest gate
and memory budget apply as in a web process. gRPC reads a whole message before
a handler runs, so a sender that stalls mid-message holds no thread.
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from django.conf import settings
from django.db import close_old_connections
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from dashboard.observatory.models import IngestTransport

from .common import IngestError, memory_reserve
from .export import LOGS, METRICS, TRACES, otlp_export
from .otlp import PROTOBUF

logger = logging.getLogger(__name__)

TRACE_SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
LOGS_SERVICE = logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name
METRICS_SERVICE = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,  # no RetryInfo: not retryable
    415: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def status_of(exc: IngestError) -> tuple[grpc.StatusCode, bytes | None]:
    """The gRPC status of a refusal, and the google.rpc.Status (with RetryInfo when
    the client should come back later) for ``grpc-status-details-bin``."""
    code = _CODES.get(exc.status, grpc.StatusCode.INTERNAL)
    if exc.retry_after is None:
        return code, None
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=exc.retry_after)))
    status = status_pb2.Status(code=code.value[0], message=exc.message, details=[detail])
    return code, status.SerializeToString()


def _bearer(context: grpc.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else ""
    return ""


def _export(signal: str, request: bytes, context: grpc.ServicerContext) -> bytes:
    close_old_connections()  # what Django does around every HTTP request
    try:
        outcome = otlp_export(
            signal=signal, authorization=_bearer(context), read_body=lambda: _body(request), content_type=PROTOBUF,
            transport=IngestTransport.OTLP_GRPC,
        )
        return outcome.response_protobuf()
    except IngestError as exc:
        code, details = status_of(exc)
        if details is not None:
            context.set_trailing_metadata((("grpc-status-details-bin", details),))
        context.abort(code, exc.message)
    except Exception:
        logger.exception("OTLP/gRPC %s export failed", signal)
        context.abort(grpc.StatusCode.INTERNAL, "internal error")
    finally:
        close_old_connections()
    raise AssertionError("unreachable")  # context.abort raises


def _body(request: bytes) -> bytes:
    # gRPC has inflated and size-checked the message; count it like an HTTP body.
    if len(request) > settings.OBSERVATORY_MAX_DECODED_BYTES:
        raise IngestError(413, f"message larger than {settings.OBSERVATORY_MAX_DECODED_BYTES} bytes")
    memory_reserve(len(request), "the message")
    return request


def _handler(signal: str) -> grpc.RpcMethodHandler:
    # No (de)serializers: the bytes go to the decoder HTTP uses, under its bounds.
    return grpc.unary_unary_rpc_method_handler(lambda request, context: _export(signal, request, context))


def grpc_server_build(*, port: int, host: str = "127.0.0.1", threads: int | None = None,
                      max_concurrent_rpcs: int | None = None, reuseport: bool | None = None) -> tuple[grpc.Server, int]:
    """A server ready to start, and the port it is bound to (``port=0`` picks a
    free one, for tests); ``reuseport``: other processes may serve the port too
    (OBSERVATORY_GRPC_REUSEPORT by default)."""
    if reuseport is None:
        reuseport = settings.OBSERVATORY_GRPC_REUSEPORT
    threads = threads or settings.OBSERVATORY_GRPC_THREADS
    limit = settings.OBSERVATORY_MAX_DECODED_BYTES
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="otlp-grpc"),
        handlers=[
            grpc.method_handlers_generic_handler(TRACE_SERVICE, {"Export": _handler(TRACES)}),
            grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": _handler(LOGS)}),
            grpc.method_handlers_generic_handler(METRICS_SERVICE, {"Export": _handler(METRICS)}),
        ],
        maximum_concurrent_rpcs=max_concurrent_rpcs or settings.OBSERVATORY_GRPC_MAX_CONCURRENT_RPCS,
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 1024 * 1024),
            # Several receivers may share a port (the kernel spreads connections), as
            # gunicorn's workers share theirs; off by default so a second start fails loudly.
            ("grpc.so_reuseport", 1 if reuseport else 0),
        ],
    )
    bound = server.add_insecure_port(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
    if not bound:
        raise OSError(f"cannot listen on {host}:{port}")
    return server, bound

