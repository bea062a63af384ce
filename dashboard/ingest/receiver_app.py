"""The OTLP/HTTP receiver (4318) as an ASGI app, for a well-kept server (Granian,
uvicorn) to serve: ``manage.py otlp_http --server granian|uvicorn``.

What the server does: HTTP/1.1 parsing and its bounds (request line, header
fields), keep-alive and its idle timeout, worker processes sharing the port, a
bound on connections or requests at once, graceful stop on SIGTERM.

What this app does (what the hand-built receiver it replaced did): POST
/v1/traces, /v1/logs and /v1/metrics (404 elsewhere, 405 for another method, 415 for another
content type, in plain text); the body bounded as it arrives, chunked or not
(OBSERVATORY_MAX_BODY_BYTES: 413 and the connection closed), the time to its last
byte (OBSERVATORY_BODY_READ_TIMEOUT: 408, closed), the bodies of all requests read
and not answered yet (OBSERVATORY_INGEST_MEMORY_BYTES: a chunk past it is a 503
with Retry-After, or 413 when its request alone is larger); a refusal before the
body is read whole closes the connection, so what is left of it is never read.

The group commit: a request read whole waits for the next group; once per turn of
the loop (and after a wait of at most GATHER_WAIT for the clients answered by the
group before, within GATHER_RECENT: senders in a loop that send again at once) the
requests waiting are stored as one group (``otlp_export_all``: each checked, read
and decoded on its own, the writes in group transactions) and each is answered
after the commit, with its own outcome: an Export*ServiceResponse (partial_success
when items were rejected), or a ``google.rpc.Status`` in the request's encoding
(429/503 with Retry-After: send again; a 500 naming nothing internal for a broken
database). While a group is stored the loop does nothing else (the server's own
threads keep reading); the requests that arrive meanwhile make the next group.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from django.conf import settings
from django.db import close_old_connections, connections

from .common import BUSY_RETRY_AFTER, IngestError, decode_content
from .export import LOGS, METRICS, TRACES, ExportOutcome, ExportRequest, otlp_export_all
from .group_commit import MAX_GROUP, fitting
from .lifetime import end_with_parent
from .otlp import CONTENT_TYPES, encode_status

logger = logging.getLogger(__name__)

PATHS = {"/v1/traces": TRACES, "/v1/logs": LOGS, "/v1/metrics": METRICS}
GROUP_MAX_BYTES = 4 * 1024 * 1024  # body bytes stored together at most (one bigger request is a group alone)
GATHER_WAIT = 0.002  # seconds a group waits, at most, for the clients answered just before it
GATHER_RECENT = 0.01  # ... when they were answered this recently (else they are not sending in a loop)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class _Refused(IngestError):
    """Answered in plain text before the body was read whole: the connection is closed."""


@dataclass(slots=True)
class _Request:
    signal: str
    client: Any  # (host, port): which connection, for the gathering wait
    content_type: str
    authorization: str
    encoding: str
    body: list[bytes] = field(default_factory=list)
    size: int = 0  # body bytes read
    held: int = 0  # ... and counted in the app's ``held``


PARENT_VARIABLE = "OBSERVATORY_RECEIVER_PARENT"  # the server's main process, set by manage.py otlp_http


def stop_with_parent() -> None:
    """In a worker of ``manage.py otlp_http``: stopped when the server's main process
    dies (Granian leaves its workers running when its main process is killed)."""
    parent = os.environ.get(PARENT_VARIABLE)
    if parent:
        end_with_parent(int(parent))


def allow_blocking_database() -> None:
    """Let the loop's thread use the ORM: Django refuses it in a thread that runs an
    event loop; here blocking the loop while a group is stored is the design."""
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


class ReceiverApp:
    """The ASGI app: one a worker process (its loop, its group, its database connection)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.waiting: list[tuple[_Request, asyncio.Future]] = []
        self.scheduled = False
        self.gathering: asyncio.Handle | None = None
        self.expected: set[Any] = set()  # clients answered in the last group, not sent again yet
        self.answered_at = 0.0
        self.held = 0  # body bytes read and not answered, of all requests
        self.groups = 0  # groups stored, and the requests in them
        self.requests = 0
        # Django keeps its connections in a context variable and the loop runs each task in
        # a copied context: the groups run in this one, so they share one connection.
        self.context = contextvars.copy_context()
        self.max_body_bytes = settings.OBSERVATORY_MAX_BODY_BYTES
        self.max_decoded_bytes = settings.OBSERVATORY_MAX_DECODED_BYTES
        self.read_timeout = float(settings.OBSERVATORY_BODY_READ_TIMEOUT)
        self.memory_budget = settings.OBSERVATORY_INGEST_MEMORY_BYTES

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # (websockets: the servers are started without them)
        self.loop = self.loop or asyncio.get_running_loop()
        try:
            request = self._request(scope)
            await self._read(request, receive)
        except _Refused as refused:
            await _answer(send, refused.status, "text/plain", f"{refused.message}\n".encode(), close=True,
                          retry_after=refused.retry_after, allow=refused.status == 405)
            return
        except _Gone:
            return
        try:
            outcome = await self._stored(request)
        finally:
            self._free(request)
        content_type = request.content_type
        if isinstance(outcome, ExportOutcome):
            await _answer(send, 200, content_type, outcome.response(content_type))
        elif isinstance(outcome, IngestError):
            await _answer(send, outcome.status, content_type,
                          encode_status(outcome.status, outcome.message, content_type),
                          retry_after=outcome.retry_after)
        else:
            logger.error("OTLP/HTTP %s export failed", request.signal, exc_info=outcome)
            await _answer(send, 500, "text/plain", b"internal error\n", close=True)

    # --- reading -------------------------------------------------------------------

    def _request(self, scope: dict[str, Any]) -> _Request:
        signal = PATHS.get(scope["path"])
        if signal is None:
            raise _Refused(404, "not found; OTLP/HTTP is POST /v1/traces, /v1/logs or /v1/metrics")
        if scope["method"] != "POST":
            raise _Refused(405, "use POST")
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers[name.lower()] = value
        content_type = headers.get(b"content-type", b"").decode("latin-1").partition(";")[0].strip().lower()
        if content_type not in CONTENT_TYPES:
            raise _Refused(415, "unsupported content type; send application/x-protobuf or application/json")
        declared = headers.get(b"content-length")
        if declared is not None:
            self._check_size(int(declared) if declared.isdigit() else 0)
        return _Request(signal, scope.get("client"), content_type,
                        headers.get(b"authorization", b"").decode("latin-1"),
                        headers.get(b"content-encoding", b"").decode("latin-1"))

    def _check_size(self, size: int) -> None:
        """Refuse a body of ``size`` bytes (declared, or read so far) that can never fit."""
        if size > self.max_body_bytes:
            raise _Refused(413, f"body larger than {self.max_body_bytes} bytes")
        if size > self.memory_budget:
            raise _Refused(413, "the body is larger than the ingest memory budget: send smaller batches")

    async def _read(self, request: _Request, receive: Receive) -> None:
        """The body, bounded in size, in time (from now) and by the memory all requests hold."""
        deadline = self.loop.time() + self.read_timeout  # type: ignore[union-attr]
        try:
            async with asyncio.timeout_at(deadline):  # one timer for the whole body, not one a chunk
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _Gone
                    chunk = message.get("body", b"")
                    if chunk:
                        request.size += len(chunk)
                        self._check_size(request.size)
                        if self.held + len(chunk) > self.memory_budget:
                            raise _Refused(503, "ingest memory in use by other requests, retry later",
                                           retry_after=BUSY_RETRY_AFTER)
                        self.held += len(chunk)
                        request.held += len(chunk)
                        request.body.append(chunk)
                    if not message.get("more_body", False):
                        return
        except TimeoutError:
            self._free(request)
            raise _Refused(408, "the request did not arrive in time") from None
        except BaseException:
            self._free(request)
            raise

    def _free(self, request: _Request) -> None:
        self.held -= request.held
        request.held = 0
        request.body = []

    # --- the group commit --------------------------------------------------------------

    def _stored(self, request: _Request) -> asyncio.Future:
        """A future of the request's outcome, once its group is stored."""
        loop = self.loop
        assert loop is not None
        future = loop.create_future()
        self.waiting.append((request, future))
        self.expected.discard(request.client)
        if self.scheduled:
            if self.gathering is not None and (not self.expected or self._full()):
                self.gathering.cancel()  # everyone expected is here: store now
                self.gathering = loop.call_soon(self._store)
            return future
        self.scheduled = True
        if self.expected and not self._full() and loop.time() - self.answered_at < GATHER_RECENT:
            self.gathering = loop.call_later(GATHER_WAIT, self._store)
        else:
            self.loop.call_soon(self._store)  # after the loop has run what else arrived
        return future

    def _group_size(self) -> int:
        return fitting((request.size for request, _ in self.waiting), count=MAX_GROUP, total=GROUP_MAX_BYTES)

    def _full(self) -> bool:
        return len(self.waiting) >= MAX_GROUP or self._group_size() < len(self.waiting)

    def _store(self) -> None:
        """Store the requests waiting as one group (within its bounds); resolve each one's future."""
        self.scheduled = False
        self.gathering = None
        count = self._group_size()
        group, self.waiting = self.waiting[:count], self.waiting[count:]
        if self.waiting:
            self.scheduled = True
            self.loop.call_soon(self._store)  # type: ignore[union-attr]
        live = [(request, future) for request, future in group if not future.cancelled()]
        try:
            outcomes = self.context.run(self._export, [request for request, _ in live])
        except Exception as exc:  # noqa: BLE001 - every request gets an answer
            outcomes = [exc] * len(live)
        self.groups += 1
        self.requests += len(live)
        for (_, future), outcome in zip(live, outcomes):
            if not future.cancelled():
                future.set_result(outcome)
        # The clients just answered are the likely next ones (a busy fleet sends again at once).
        self.expected = {request.client for request, _ in live if request.client is not None}
        self.answered_at = self.loop.time()  # type: ignore[union-attr]

    def _export(self, group: list[_Request]) -> list[Any]:
        close_old_connections()  # what Django does around every HTTP request
        return otlp_export_all([self._export_request(request) for request in group])

    def _export_request(self, request: _Request) -> ExportRequest:
        raw = b"".join(request.body)
        encoding = request.encoding
        return ExportRequest(
            signal=request.signal,
            authorization=request.authorization,
            read_body=lambda: decode_content(raw, encoding, max_decoded_bytes=self.max_decoded_bytes),
            content_type=request.content_type,
        )

    # --- lifespan ----------------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                allow_blocking_database()
                stop_with_parent()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def close(self) -> None:
        """At the worker's end: its database connection closed, its derivations' turn finished."""
        from dashboard.observatory.derive.runner import background_stop

        self.context.run(connections.close_all)
        background_stop()
        logger.info("OTLP/HTTP receiver process %d stopped: %d requests stored in %d groups",
                    os.getpid(), self.requests, self.groups)


class _Gone(Exception):
    """The client went away before its body came whole: nothing to answer."""


async def _answer(send: Send, status: int, content_type: str, body: bytes, *, close: bool = False,
                  retry_after: int | None = None, allow: bool = False) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    if allow:
        headers.append((b"allow", b"POST"))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
