"""OTLP/HTTP on a port of its own (4318, as collectors listen): ``manage.py otlp_http``.

The dashboard's own ``/v1/traces``, ``/v1/logs`` and ``/v1/metrics`` serve any deployment; this
receiver is for fleets of small batches. Under gunicorn a 10-span request cost
about 2 ms of CPU, little of it in storing: the HTTP server, Django's request
cycle and the hand-offs between a request's threads (gunicorn's loop, its worker
thread, the group commit's leader) took the rest. Here one thread a process does
all of it: an asyncio loop parses requests with httptools (llhttp, the parser of
Node.js) and, once per turn of the loop, stores every request that arrived
complete as one group (``otlp_export_all``: each checked, read and decoded on its
own, the writes in group transactions), then answers them. While a group is
stored the loop does nothing else; the requests that arrive meanwhile wait in the
kernel and make the next group, so the busier it is, the larger the groups.
Answers go out after the commit, so an acknowledged batch is a stored one.

A group also waits a moment for its senders (``GATHER_WAIT``, 2 ms at most): the
connections answered by the group before, within ``GATHER_RECENT``, are senders in a
loop that send again at once, so the next group starts only when they all have
sent, or closed, or the wait is over. Without it the requests came a few at a time
as the senders got the CPU: 16 senders of 10-span batches made groups of 4, and a
group's fixed cost (its transaction's statements and commit, in Python and in the
database) was about a fifth of a request's. With it the groups hold 7.7 on
average: 2,126-2,284 requests/s on PostgreSQL where they stored 1,571-1,735. A lone
sender, or senders answered longer ago (not sending in a loop), wait for nobody.

The answers are those of the dashboard's views (``otlp_views``):
an Export*ServiceResponse (``partial_success`` when items were rejected) or a
``google.rpc.Status`` in the request's encoding, with Retry-After on 429/503
(a 503 for a busy database, a 500 naming nothing internal for a broken one: each
request of a group its own, see ``otlp_export_all``); 404/405/415 in plain text. Bounded like a web process: the request line
(8190 bytes), at most 100 header fields of 64 KiB in all, the body
(OBSERVATORY_MAX_BODY_BYTES, checked as it arrives, chunked or not; refused with
413 and the connection closed), the time from a request's first byte to its last
(OBSERVATORY_BODY_READ_TIMEOUT: 408), the bodies read and not yet answered, of all
connections (OBSERVATORY_INGEST_MEMORY_BYTES: a chunk past it is refused with 503 and
Retry-After, or 413 when its request alone is larger), idle keep-alive connections
(OBSERVATORY_OTLP_HTTP_IDLE_TIMEOUT), connections at once
(OBSERVATORY_OTLP_HTTP_MAX_CONNECTIONS: past it, 503 and closed), and what one
group holds decoded (the group commit's ``MAX_GROUP`` requests, ``GROUP_MAX_BYTES``); the ingest gate's
memory budget counts each request as it is decoded. A connection is not read
while its request waits for its group, so a sender cannot queue more than it sent
in one packet.

Processes: ``serve`` binds the port, forks OBSERVATORY_OTLP_HTTP_PROCESSES
children that share it (one a core: each is one thread of Python) and starts
a new one when one dies. SIGTERM or SIGINT stops them gracefully: no new
connections, the requests read are stored and answered, then the process exits.

The children share the connections evenly (``Balance``). Left to asyncio, the
child that woke first took every connection waiting (up to a hundred at a time):
16 senders connecting together gave one child 14 to 16 of them and left the other
core idle, at half the requests/s. Each child publishes how many connections it
has (a slot of shared memory); one that has more than the least loaded leaves a
new connection to the others, and takes it itself only if nobody did within
``BALANCE_WAIT`` (the others busy storing, or dead).
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import logging
import mmap
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable

import httptools
from django.conf import settings
from django.db import close_old_connections, connections

from dashboard.observatory.derive.runner import background_stop

from .common import BUSY_RETRY_AFTER, IngestError, decode_content
from .export import LOGS, METRICS, TRACES, ExportOutcome, ExportRequest, otlp_export_all
from .group_commit import MAX_GROUP, fitting
from .otlp import CONTENT_TYPES, encode_status

logger = logging.getLogger(__name__)

PATHS = {b"/v1/traces": TRACES, b"/v1/logs": LOGS, b"/v1/metrics": METRICS}
MAX_URL = 8190
MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 * 1024
GROUP_MAX_BYTES = 4 * 1024 * 1024  # body bytes stored together at most (one bigger request is a group alone)
GATHER_WAIT = 0.002  # seconds a group waits, at most, for the senders answered just before it
GATHER_RECENT = 0.01  # ... when they were answered this recently (else they are not sending in a loop)
LINGER_SECONDS = 2.0  # a closing connection reads and drops what still comes for this long
_WANTED = {b"authorization", b"content-type", b"content-encoding", b"content-length"}


@dataclass(slots=True)
class _Request:
    signal: str | None = None
    content_type: str = ""  # its media type, lowercased (the answer is in it too)
    url: bytearray = field(default_factory=bytearray)
    headers: dict[bytes, bytes] = field(default_factory=dict)
    header_count: int = 0
    header_bytes: int = 0
    body: list[bytes] = field(default_factory=list)
    size: int = 0
    keep_alive: bool = True

    def header(self, name: bytes) -> str:
        return self.headers.get(name, b"").decode("latin-1")


class _Refused(IngestError):
    """A request answered before it is stored, in plain text (its connection is then closed)."""


class Connection(asyncio.Protocol):
    """One client connection: parses its requests and hands each complete one to
    the receiver; writes the answers in order."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.request: _Request | None = None
        self.in_flight = 0  # requests handed over, not answered yet
        self.closing = False
        self.refusal: tuple[int, str, int | None] | None = None  # to answer once those in flight are
        self.timer: asyncio.TimerHandle | None = None
        self.held = 0  # body bytes of this connection's requests read and not answered

    # --- asyncio ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.receiver.connections.add(self)
        self.receiver.on_connections()
        if len(self.receiver.connections) > self.receiver.max_connections:
            self._refuse(503, "too many connections, retry later", retry_after=1)
            return
        self._arm(self.receiver.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._disarm()
        self.receiver.connections.discard(self)
        self.receiver.on_connections()
        self.receiver.forget(self)
        self._free(self.held)

    def data_received(self, data: bytes) -> None:
        if self.closing or self.refusal:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrade not supported")
        except httptools.HttpParserError as exc:
            # A refusal raised in a callback comes back as the context of the parser's error.
            refused = exc.__context__ if isinstance(exc.__context__, _Refused) else _Refused(400, "malformed HTTP request")
            self._refuse(refused.status, refused.message, refused.retry_after)

    # --- httptools ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.request = _Request()
        self._arm(self.receiver.read_timeout, self._timed_out)

    def on_url(self, url: bytes) -> None:
        request = self._current()
        request.url += url
        if len(request.url) > MAX_URL:
            raise _Refused(414, "request line too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self._current()
        request.header_count += 1
        request.header_bytes += len(name) + len(value)
        if request.header_count > MAX_HEADERS or request.header_bytes > MAX_HEADER_BYTES:
            raise _Refused(431, "request header fields too large")
        name = name.lower()
        if name in _WANTED:
            request.headers[name] = value

    def on_headers_complete(self) -> None:
        request = self._current()
        request.keep_alive = self.parser.should_keep_alive()
        if self.parser.should_upgrade():
            raise _Refused(400, "protocol upgrade not supported")
        path = bytes(request.url).partition(b"?")[0]
        request.signal = PATHS.get(path)
        if request.signal is None:
            raise _Refused(404, "not found; OTLP/HTTP is POST /v1/traces, /v1/logs or /v1/metrics")
        if self.parser.get_method() != b"POST":
            raise _Refused(405, "use POST")
        request.content_type = request.header(b"content-type").partition(";")[0].strip().lower()
        if request.content_type not in CONTENT_TYPES:
            raise _Refused(415, "unsupported content type; send application/x-protobuf or application/json")
        declared = request.headers.get(b"content-length")  # a valid number: llhttp checked it
        if declared is not None:
            self._check_size(int(declared))

    def _check_size(self, size: int) -> None:
        """Refuse a body of ``size`` bytes (declared, or read so far) that can never fit."""
        if size > self.receiver.max_body_bytes:
            raise _Refused(413, f"body larger than {self.receiver.max_body_bytes} bytes")
        if size > self.receiver.memory_budget:
            raise _Refused(413, "the body is larger than the ingest memory budget: send smaller batches")

    def on_body(self, chunk: bytes) -> None:
        request = self._current()
        request.size += len(chunk)
        self._check_size(request.size)
        receiver = self.receiver
        if receiver.held + len(chunk) > receiver.memory_budget:
            raise _Refused(503, "ingest memory in use by other requests, retry later", retry_after=BUSY_RETRY_AFTER)
        self._hold(len(chunk))
        request.body.append(chunk)

    def on_message_complete(self) -> None:
        request, self.request = self._current(), None
        self._disarm()
        self.in_flight += 1
        self.transport.pause_reading()  # type: ignore[union-attr]
        self.receiver.submit(self, request)

    # --- answers -----------------------------------------------------------------

    def answer(self, request: _Request, outcome: ExportOutcome | BaseException) -> None:
        """Write the answer to ``request`` (its outcome from ``otlp_export_all``)."""
        self.in_flight -= 1
        self._free(request.size)
        content_type = request.content_type
        if isinstance(outcome, ExportOutcome):
            self._write(200, content_type, outcome.response(content_type), close=not request.keep_alive)
        elif isinstance(outcome, IngestError):
            self._write(outcome.status, content_type, encode_status(outcome.status, outcome.message, content_type),
                        close=not request.keep_alive, retry_after=outcome.retry_after)
        else:
            logger.error("OTLP/HTTP %s export failed", request.signal, exc_info=outcome)
            self._write(500, "text/plain", b"internal error\n", close=True)
        if self.closing or self.in_flight:
            return
        if self.refusal:
            self._refuse(*self.refusal)
        else:
            if self.request is None:  # else its read deadline stays armed
                self._arm(self.receiver.idle_timeout)
            self.transport.resume_reading()  # type: ignore[union-attr]

    def _refuse(self, status: int, message: str, retry_after: int | None = None) -> None:
        """Answer in plain text and close (the rest of what was sent is not read); after
        the answers to the requests before it (pipelined), which are in flight."""
        if self.in_flight:
            self.refusal = (status, message, retry_after)
            self._disarm()
            self.transport.pause_reading()  # type: ignore[union-attr]
            return
        self._write(status, "text/plain", f"{message}\n".encode(), close=True, retry_after=retry_after)

    def _timed_out(self) -> None:
        self._refuse(408, "the request did not arrive in time")

    def _write(self, status: int, content_type: str, body: bytes, *, close: bool,
               retry_after: int | None = None) -> None:
        if self.closing:
            return
        head = [f"HTTP/1.1 {status} {_reason(status)}", f"Content-Type: {content_type}",
                f"Content-Length: {len(body)}"]
        if retry_after is not None:
            head.append(f"Retry-After: {retry_after}")
        if status == 405:
            head.append("Allow: POST")
        if close or self.receiver.stopping:
            head.append("Connection: close")
        self.transport.write("\r\n".join(head).encode() + b"\r\n\r\n" + body)  # type: ignore[union-attr]
        if close or self.receiver.stopping:
            self._linger()

    def _linger(self) -> None:
        """Close after the answer, without losing it: the sender may still be sending
        the body of a request refused early, and closing with data unread would reset
        the connection under the answer. So end our side (the answer, then EOF), read
        and drop what still comes for up to LINGER_SECONDS, then close."""
        self.closing = True
        if self.transport.can_write_eof():  # type: ignore[union-attr]
            self.transport.write_eof()  # type: ignore[union-attr]
        self.transport.resume_reading()  # type: ignore[union-attr]  # to drop what comes
        self._arm(LINGER_SECONDS, self.transport.close)  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        return False  # the sender is done: close (our side may be done too)

    def close_idle(self) -> None:
        """At shutdown: close now unless a request is being read or stored."""
        if self.request is None and not self.in_flight:
            self.closing = True
            self._disarm()
            self.transport.close()  # type: ignore[union-attr]

    # --- helpers -------------------------------------------------------------------

    def _hold(self, size: int) -> None:
        self.held += size
        self.receiver.held += size

    def _free(self, size: int) -> None:
        size = min(size, self.held)
        self.held -= size
        self.receiver.held -= size

    def _current(self) -> _Request:
        if self.request is None:  # a callback out of order: never expected from llhttp
            raise _Refused(400, "malformed HTTP request")
        return self.request

    def _arm(self, seconds: float, then: Any = None) -> None:
        self._disarm()
        self.timer = self.receiver.loop.call_later(seconds, then or self._idle)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _idle(self) -> None:
        self.timer = None
        self.close_idle()


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class Receiver:
    """One process's connections and the requests waiting for the next group."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.connections: set[Connection] = set()
        self.waiting: list[tuple[Connection, _Request]] = []
        self.scheduled = False
        self.gathering: asyncio.Handle | None = None  # the group's start, while it waits for ``expected``
        self.expected: set[Connection] = set()  # answered in the last group, not sent again yet
        self.answered_at = 0.0  # when (loop time)
        self.stopping = False
        self.groups = 0  # groups stored, and the requests in them (logged at the end)
        self.requests = 0
        # The loop runs each callback in a copy of the context it was scheduled from, and
        # Django keeps its connections in a context variable: without one context of our
        # own, each group would open a database connection and leave it open.
        self.context = contextvars.copy_context()
        self.max_connections = settings.OBSERVATORY_OTLP_HTTP_MAX_CONNECTIONS
        self.idle_timeout = float(settings.OBSERVATORY_OTLP_HTTP_IDLE_TIMEOUT)
        self.read_timeout = float(settings.OBSERVATORY_BODY_READ_TIMEOUT)
        self.max_body_bytes = settings.OBSERVATORY_MAX_BODY_BYTES
        self.max_decoded_bytes = settings.OBSERVATORY_MAX_DECODED_BYTES
        # Bodies read and not answered yet, of all connections: at most the ingest memory
        # budget (a chunk past it is refused, 503, or 413 when its request alone is larger).
        self.memory_budget = settings.OBSERVATORY_INGEST_MEMORY_BYTES
        self.held = 0
        self.on_connections: Callable[[], None] = lambda: None  # told when a connection opens or closes

    def protocol(self) -> Connection:
        return Connection(self)

    def submit(self, connection: Connection, request: _Request) -> None:
        self.waiting.append((connection, request))
        self.expected.discard(connection)
        if self.scheduled:
            if self.gathering is not None and (not self.expected or self._full()):
                self.gathering.cancel()  # everyone expected is here: store now
                self.gathering = self.loop.call_soon(self._store)
            return
        self.scheduled = True
        if self.expected and not self._full() and self.loop.time() - self.answered_at < GATHER_RECENT:
            self.gathering = self.loop.call_later(GATHER_WAIT, self._store)
        else:
            self.loop.call_soon(self._store)  # after the loop has read what else arrived

    def forget(self, connection: Connection) -> None:
        """A connection closed: no request is expected from it."""
        self.expected.discard(connection)
        if self.gathering is not None and not self.expected:
            self.gathering.cancel()
            self.gathering = self.loop.call_soon(self._store)

    def _group_size(self) -> int:
        """How many of the requests waiting make the next group (its bounds: ``fitting``)."""
        return fitting((request.size for _, request in self.waiting), count=MAX_GROUP, total=GROUP_MAX_BYTES)

    def _full(self) -> bool:
        """The next group can take no more requests: no reason to wait for others."""
        return len(self.waiting) >= MAX_GROUP or self._group_size() < len(self.waiting)

    def _store(self) -> None:
        """Store the requests waiting, as one group (within its bounds), and answer them."""
        self.scheduled = False
        self.gathering = None
        count = self._group_size()
        group, self.waiting = self.waiting[:count], self.waiting[count:]
        if self.waiting:
            self.scheduled = True
            self.loop.call_soon(self._store)
        try:
            outcomes = self.context.run(self._export, group)
        except Exception as exc:  # noqa: BLE001 - every request gets an answer
            outcomes = [exc] * len(group)
        self.groups += 1
        self.requests += len(group)
        for (connection, request), outcome in zip(group, outcomes):
            connection.answer(request, outcome)
        # The senders just answered are the likely next ones (a busy fleet sends again
        # at once): the next group waits a moment for them (``submit``).
        self.expected = {connection for connection, request in group if request.keep_alive and not connection.closing}
        self.answered_at = self.loop.time()

    def _export(self, group: list[tuple[Connection, _Request]]) -> list[Any]:
        close_old_connections()  # what Django does around every HTTP request
        return otlp_export_all([self._export_request(request) for _, request in group])

    def _export_request(self, request: _Request) -> ExportRequest:
        raw, request.body = b"".join(request.body), []
        encoding = request.header(b"content-encoding")
        return ExportRequest(
            signal=request.signal or TRACES,
            authorization=request.header(b"authorization"),
            read_body=lambda: decode_content(raw, encoding, max_decoded_bytes=self.max_decoded_bytes),
            content_type=request.content_type,
        )

    def stop(self) -> None:
        self.stopping = True
        for connection in list(self.connections):
            connection.close_idle()

    async def drained(self, grace: float) -> None:
        """Once the requests read are answered (or ``grace`` seconds passed)."""
        deadline = self.loop.time() + grace
        while (self.waiting or any(c.in_flight or c.request for c in self.connections)) and self.loop.time() < deadline:
            await asyncio.sleep(0.05)


BALANCE_WAIT = 0.01  # seconds a child with more connections than another leaves a new one to the others
ACCEPT_AT_ONCE = 16  # connections a child accepts in one turn of its loop, at most


class Balance:
    """How many connections each child has: one int64 slot a child in shared memory
    (mapped before the fork), written by its child only."""

    def __init__(self, processes: int) -> None:
        self._memory = mmap.mmap(-1, 8 * processes)
        self._counts = (ctypes.c_int64 * processes).from_buffer(self._memory)
        self.slot = -1  # this child's, once forked

    def take(self, slot: int) -> None:
        """In a newly forked child: its slot, starting at 0 (a dead child's may be stale)."""
        self.slot = slot
        self._counts[slot] = 0

    def publish(self, count: int) -> None:
        self._counts[self.slot] = count

    def least_loaded(self) -> bool:
        """Whether no other child has fewer connections than this one."""
        own = self._counts[self.slot]
        return all(own <= count for count in self._counts)


class _Acceptor:
    """Accepts the listening socket's connections for ``receiver``; with a ``balance``,
    only as the least loaded child (else after BALANCE_WAIT)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, receiver: Receiver,
                 balance: Balance | None) -> None:
        self.loop, self.sock, self.receiver, self.balance = loop, sock, receiver, balance
        self.deferred: asyncio.TimerHandle | None = None
        self.pending = 0  # accepted, not yet made into a connection
        self.closed = False

    def start(self) -> None:
        self.loop.add_reader(self.sock, self._ready)

    def close(self) -> None:
        self.closed = True
        if self.deferred is not None:
            self.deferred.cancel()
        else:
            self.loop.remove_reader(self.sock)

    def publish(self) -> None:
        if self.balance is not None:
            self.balance.publish(len(self.receiver.connections) + self.pending)

    def _ready(self) -> None:
        if self.balance is None or self.balance.least_loaded():
            self._accept(until_loaded=self.balance is not None)
            return
        self.loop.remove_reader(self.sock)  # no new turn for it until the wait is over
        self.deferred = self.loop.call_later(BALANCE_WAIT, self._after_wait)

    def _after_wait(self) -> None:
        self.deferred = None
        if self.closed:
            return
        self._accept(until_loaded=False, at_most=1)  # nobody else took it: this child does
        self.loop.add_reader(self.sock, self._ready)

    def _accept(self, *, until_loaded: bool, at_most: int = ACCEPT_AT_ONCE) -> None:
        for _ in range(at_most):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return  # none waiting (another child took it)
            except OSError as exc:  # out of descriptors, ...: the connection waits in the backlog
                logger.warning("OTLP/HTTP receiver could not accept a connection: %s", exc)
                return
            conn.setblocking(False)
            self.pending += 1
            self.publish()
            self.loop.create_task(self._connect(conn))
            if until_loaded and not self.balance.least_loaded():  # type: ignore[union-attr]
                return

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.receiver.protocol, sock=conn)
        except OSError:
            conn.close()
        finally:
            self.pending -= 1
            self.publish()


def allow_blocking_database() -> None:
    """Let the loop's thread use the ORM. Django refuses it in a thread that runs an
    event loop, for fear of blocking other tasks; here blocking the loop while a
    group is stored is the design (the process has nothing else to do meanwhile)."""
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


async def serve_socket(sock: socket.socket, stop: asyncio.Event, *, grace: float = 10.0,
                       receiver: Receiver | None = None, balance: Balance | None = None) -> None:
    """Serve the listening ``sock`` in this process until ``stop`` is set, then stop
    gracefully (see the module's text); with ``receiver`` (made on this loop), as it;
    with ``balance``, sharing the connections evenly with the other children."""
    loop = asyncio.get_running_loop()
    receiver = receiver or Receiver(loop)
    acceptor = _Acceptor(loop, sock, receiver, balance)
    receiver.on_connections = acceptor.publish
    acceptor.start()
    try:
        await stop.wait()
    finally:
        acceptor.close()
        receiver.stop()
        await receiver.drained(grace)
        for connection in list(receiver.connections):
            connection.closing = True
            if connection.transport is not None:
                connection.transport.abort()
        receiver.context.run(connections.close_all)
        logger.info("OTLP/HTTP receiver process %d stopped: %d requests stored in %d groups",
                    os.getpid(), receiver.requests, receiver.groups)


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _child(sock: socket.socket, grace: float, balance: Balance) -> None:
    """A forked process: serve until SIGTERM/SIGINT, then exit."""
    allow_blocking_database()
    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve_socket(sock, stop, grace=grace, balance=balance)

    asyncio.run(main())
    background_stop()  # the derivations this process started finish their turn


def serve(host: str, port: int, *, processes: int, grace: float = 10.0, ready: Any = None) -> None:
    """Bind ``host:port`` and serve it from ``processes`` forked children until
    SIGTERM/SIGINT; a child that dies is replaced. ``ready(port)`` is called once
    the port is bound (``port=0`` picks a free one)."""
    sock = listening_socket(host, port)
    if ready is not None:
        ready(sock.getsockname()[1])
    connections.close_all()  # none may cross the fork
    balance = Balance(processes)
    stopping = False
    children: dict[int, int] = {}  # pid -> its slot in the balance

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            _signal(pid, signal.SIGTERM)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            while not stopping and len(children) < processes:
                parent = os.getpid()
                slot = min(set(range(processes)) - set(children.values()))
                pid = os.fork()
                if pid == 0:
                    for signum, handler in previous.items():
                        signal.signal(signum, handler)
                    _stop_with_parent(parent)
                    balance.take(slot)
                    code = 0
                    try:
                        _child(sock, grace, balance)
                    except BaseException:  # noqa: BLE001 - a child never returns into the parent's code
                        logger.exception("OTLP/HTTP receiver process failed")
                        code = 1
                    finally:
                        os._exit(code)
                children[pid] = slot
            if not children:
                return
            try:
                pid, status = os.wait()
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            children.pop(pid, None)
            if not stopping:
                logger.warning("OTLP/HTTP receiver process %d ended (status %d); starting another", pid, status)
                time.sleep(0.5)  # a child that cannot start must not spin the parent
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sock.close()


def _stop_with_parent(parent: int) -> None:
    """Have the kernel send SIGTERM to this child when the parent dies (``kill -9``
    of the parent included), so no child goes on serving the port unsupervised."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: a parent killed outright leaves its children
        return
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
