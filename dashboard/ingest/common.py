"""What every ingest endpoint does the same way: authenticate the key, read a bounded
(possibly gzipped) body, parse JSON safely, bound concurrency, and answer errors
short.

Every refusal is an IngestError carrying its HTTP status; views turn it into a
response with ``error_response`` (or let the ninja exception handler do it), so a
client's junk always gets a short 4xx and never a 500. A database error is a 503
when the database is busy (``database_busy``: send again later) and a 500 that
names nothing internal when it is broken (``database_refusal``), logged and counted.
"""

from __future__ import annotations

import functools
import heapq
import hmac
import json
import logging
import re
import socket
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any, Callable, Iterator, Sequence, TypeVar

from django.conf import settings
from django.db import DatabaseError, IntegrityError, OperationalError, connection, transaction
from django.db.models import F
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from dashboard.accounts.keys import hash_key, key_prefix
from dashboard.accounts.models import ApiKey, Project
from dashboard.observatory.busy import database_busy
from dashboard.observatory.models import IngestDatabaseFault, IngestTransport
from dashboard.priority import pages_in_progress

T = TypeVar("T")
logger = logging.getLogger(__name__)

LAST_USED_RESOLUTION = timedelta(minutes=1)
DEFAULT_JSON_DEPTH = 32
BUSY_RETRY_AFTER = 2  # seconds a client waits after a 503 "database busy"


def timestamp_bounds() -> tuple[datetime, datetime]:
    """The times an ingested item may carry: from the start of
    OBSERVATORY_TIMESTAMP_MIN_YEAR to the start of OBSERVATORY_TIMESTAMP_MAX_YEAR.
    Anything outside is refused per item (records, spans, log records): a year-9999 or
    year-1 time (valid ISO 8601, or a 64-bit nanosecond count) overflows when shifted
    to UTC, and breaks exports, partitions and date maths downstream."""
    return (
        datetime(settings.OBSERVATORY_TIMESTAMP_MIN_YEAR, 1, 1, tzinfo=dt_timezone.utc),
        datetime(settings.OBSERVATORY_TIMESTAMP_MAX_YEAR, 1, 1, tzinfo=dt_timezone.utc),
    )


def timestamp_window_nanos() -> tuple[int, int]:
    """``timestamp_bounds`` as OTLP's nanoseconds since the epoch: [low, high)."""
    earliest, latest = timestamp_bounds()
    epoch = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
    return ((earliest - epoch) // timedelta(microseconds=1) * 1000,
            (latest - epoch) // timedelta(microseconds=1) * 1000)


class IngestError(Exception):
    """A refusal with its HTTP status. ``message`` is short and safe to show."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


# --- keys -------------------------------------------------------------------------

def authenticate(request: HttpRequest) -> Project:
    """The project of the Bearer key in the request's Authorization header (see
    ``authenticate_header``); the key's id is left on ``request.api_key_id``."""
    project, key_id = authenticate_header(request.headers.get("Authorization", ""))
    request.api_key_id = key_id  # type: ignore[attr-defined]
    return project


def authenticate_header(header: str) -> tuple[Project, int]:
    """The project and key id of the Bearer key in an Authorization value, whatever
    the transport (an HTTP header, gRPC ``authorization`` metadata).

    A key seen before in this process is found in ``_known_keys`` by the sha256 of
    its text, and then only checked: one primary-key read of the key row that must
    still exist with the same hash and project and no ``revoked_at``. That read is
    what keeps a revocation (or a deleted key or project: the row is gone) in force
    from the next request on, in every process and on every host, with no message
    to deliver; it replaces the prefix lookup, the join and the hash comparison of a
    first sight. A key not seen yet is looked up by its public prefix and compared
    by hash in constant time, and remembered only when valid, so unknown texts
    never fill the cache. ``last_used_at`` is written at most once a minute (per
    process) so a busy key does not turn every ingest request into an extra write.
    """
    project, key_id, check = authenticate_deferred(header)
    if check is not None:
        key_check_run(check)
    return project, key_id


def key_check_run(check: KeyCheck) -> None:
    """Read the key's row now (one primary-key read: ``key_checks_sql``); raise its refusal."""
    failure = key_check_outcome(check, _key_row(*key_checks_sql([check])))
    if failure is not None:
        raise failure


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """The check of a key seen before (``authenticate_deferred``), to run in the
    request's write transaction: ``key_checks_sql`` reads it, ``key_check_outcome``
    says what the row read means."""

    key_id: int
    digest: str
    project_id: int


def authenticate_deferred(header: str) -> tuple[Project, int, KeyCheck | None]:
    """``authenticate_header``, but a key seen before is not read now: its check is
    returned, for the write that stores the request's items to run in its own
    transaction, before anything is committed (a revocation holds as immediately:
    the read is the transaction's, and nothing it wrote commits when it fails). The
    span writes read it in one round trip with their traces' lookup, where a read
    of its own cost a round trip a request group (a tenth of the OTLP/HTTP
    receiver's time on PostgreSQL). A key not seen yet is checked now, in full."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise IngestError(401, "missing API key")
    token = token.strip()
    digest = hash_key(token) if len(token) <= _MAX_KEY_TEXT else ""
    known = _known_keys.get(digest) if digest else None
    if known is not None:
        return known.project, known.key_id, KeyCheck(known.key_id, digest, known.project.pk)
    prefix = key_prefix(token)
    if prefix is None:
        raise IngestError(401, "invalid API key")
    row = _key_row(_key_query(), [prefix])
    if row is None or not hmac.compare_digest(row[1], digest):
        raise IngestError(401, "invalid API key")
    key_id, _, revoked_at, last_used_at, *project_values = row
    known = _KnownKey(key_id, Project.from_db(connection.alias, _project_columns(), project_values))
    failure = key_check_outcome(KeyCheck(key_id, digest, known.project.pk), (key_id, revoked_at, last_used_at), known)
    if failure is not None:
        raise failure
    return known.project, known.key_id, None


def key_checks_sql(checks: Sequence[KeyCheck]) -> tuple[str, list[Any]]:
    """One query reading the rows of ``checks`` (id, revoked_at, last_used_at), by
    their primary keys."""
    quote = connection.ops.quote_name
    where = " OR ".join(["(id = %s AND hash = %s AND project_id = %s)"] * len(checks))
    return (f"SELECT id, revoked_at, last_used_at FROM {quote(ApiKey._meta.db_table)} WHERE {where}",
            [value for check in checks for value in (check.key_id, check.digest, check.project_id)])


def key_check_outcome(check: KeyCheck, row: tuple[Any, ...] | None, known: _KnownKey | None = None, *,
                      in_write: bool = False) -> IngestError | None:
    """What the key's row read (id, revoked_at, last_used_at; None: not found) means:
    the refusal (the key forgotten by this process), or None when the key holds (it
    is remembered, and its ``last_used_at`` written when a minute old: ``in_write``,
    read by a write's transaction, after its commit)."""
    if row is None:  # deleted, or its project deleted
        _known_keys.pop(check.digest, None)
        return IngestError(401, "invalid API key")
    _, revoked_at, last_used_at = row
    if revoked_at is not None:
        _known_keys.pop(check.digest, None)
        return IngestError(401, "revoked API key")
    if known is not None:
        _remember(check.digest, known)
    now = timezone.now()
    last_used_at = _as_datetime(last_used_at)
    if last_used_at is None or now - last_used_at >= LAST_USED_RESOLUTION:
        if in_write:
            # After the write's commit, on its own: the row lock an UPDATE takes would be
            # held through the insert, where another process's write may wait for it.
            transaction.on_commit(lambda: _touch(check.key_id, now), robust=True)
        else:
            with database_errors_refused():
                _touch(check.key_id, now)
    return None


def _touch(key_id: int, now: datetime) -> None:
    ApiKey.objects.filter(pk=key_id).update(last_used_at=now)


def _key_row(sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    """One row of a key query (``reconnecting``)."""
    def read() -> tuple[Any, ...] | None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()

    with database_errors_refused():
        return reconnecting(read)


def reconnecting(read: Callable[[], T]) -> T:
    """``read()``, made once more on a new connection when it fails with the
    OperationalError of a connection the database dropped (a restart, an idle
    timeout). Ingest runs without Django's connection health check (a round trip
    on PostgreSQL: ``ingest_gate``), so its reads outside a transaction go through
    here and a dropped connection costs nothing but the reconnect, as the health
    check would have (inside one, the group commit runs its group again:
    ``group_commit._connection_lost``)."""
    try:
        return read()
    except OperationalError:
        if connection.in_atomic_block:
            raise
        connection.close()
    return read()


@dataclass(frozen=True, slots=True)
class _KnownKey:
    key_id: int
    project: Project  # its id is what ingest uses; the other fields are as first read here


_MAX_KEY_TEXT = 256  # longer than any key we issue: refused without hashing it
_KNOWN_KEYS_MAX = 10_000
# sha256 of a valid key's text -> its row id and project. Per process, filled on a
# key's first valid use, emptied of a key when a check finds it gone or revoked.
# Plain dict operations, atomic under the GIL, so the worker threads share it.
_known_keys: dict[str, _KnownKey] = {}


def _remember(digest: str, known: _KnownKey) -> None:
    if digest not in _known_keys:
        if len(_known_keys) >= _KNOWN_KEYS_MAX:
            _known_keys.clear()  # bounded; keys in use come back at their next request
        _known_keys[digest] = known


@functools.cache
def _project_columns() -> tuple[str, ...]:
    return tuple(field.attname for field in Project._meta.concrete_fields)


@functools.cache
def _key_query() -> str:
    key_table, project_table = ApiKey._meta.db_table, Project._meta.db_table
    quote = connection.ops.quote_name
    project_columns = ", ".join(f"p.{quote(column)}" for column in _project_columns())
    return (
        f"SELECT k.id, k.hash, k.revoked_at, k.last_used_at, {project_columns} "
        f"FROM {quote(key_table)} k JOIN {quote(project_table)} p ON p.id = k.project_id "
        "WHERE k.prefix = %s"
    )


def _as_datetime(value: Any) -> datetime | None:
    """A timestamp column as an aware datetime (SQLite hands back naive UTC, or text)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt_timezone.utc)


# --- bodies -----------------------------------------------------------------------

def read_body(request: HttpRequest, *, max_bytes: int, max_decoded_bytes: int) -> bytes:
    """The request body, decoded from gzip when so encoded, bounded on both sides.

    Content-Length is checked before anything is read; at most max_bytes + 1 bytes
    are read; gzip is inflated with a bounded output so a small bomb cannot expand
    past max_decoded_bytes. A body sent with ``Transfer-Encoding: chunked`` (no
    length: the OpenTelemetry JS exporters) is read to its end under the same
    limit. The read is a ``BodyReader``: a body that ends before its declared
    length is a 400 (never a half batch stored and answered 200), and the whole
    read is bounded by OBSERVATORY_BODY_READ_TIMEOUT, so a sender that stalls
    mid-body gets 408 instead of holding a worker thread.
    """
    with BodyReader(request, max_bytes=max_bytes) as body:
        raw = _read_up_to(body, max_bytes + 1)
    if len(raw) > max_bytes:
        raise IngestError(413, f"body larger than {max_bytes} bytes")
    return decode_content(raw, request.headers.get("Content-Encoding", ""), max_decoded_bytes=max_decoded_bytes)


def content_type_required(request: HttpRequest, allowed: tuple[str, ...], message: str) -> None:
    """415 with ``message`` unless the request's content type is one of ``allowed``."""
    if (request.content_type or "").lower() not in allowed:
        raise IngestError(415, message)


def batch_body(request: HttpRequest, batch: IngestBatch) -> bytes:
    """A JSON API batch's body (records, scores, dataset items), read whole within the
    ingest limits (OBSERVATORY_MAX_BODY_BYTES, OBSERVATORY_MAX_DECODED_BYTES); its size
    noted on the batch."""
    body = read_body(request, max_bytes=settings.OBSERVATORY_MAX_BODY_BYTES,
                     max_decoded_bytes=settings.OBSERVATORY_MAX_DECODED_BYTES)
    batch.nbytes = len(body)
    return body


def decode_content(raw: bytes, encoding: str, *, max_decoded_bytes: int) -> bytes:
    """A body as received (``raw``, already within the byte limit) decoded from its
    Content-Encoding: counted against the request's memory budget, inflated from
    gzip with a bounded output, at most ``max_decoded_bytes``."""
    encoding = encoding.strip().lower()
    memory_reserve(len(raw), "the body")
    if encoding in ("", "identity"):
        if len(raw) > max_decoded_bytes:
            raise IngestError(413, f"body larger than {max_decoded_bytes} bytes")
        return raw
    if encoding in ("gzip", "x-gzip"):
        return gunzip_bounded(raw, max_decoded_bytes)
    raise IngestError(415, "unsupported Content-Encoding (use gzip or identity)")


def declared_length(request: HttpRequest, *, max_bytes: int) -> int | None:
    """The request's Content-Length (None when it has none: a chunked body), refused
    when malformed (400) or past ``max_bytes`` (413) before a byte is read."""
    declared = request.headers.get("Content-Length")
    if not declared:
        return None
    try:
        length = int(declared)
    except ValueError:
        raise IngestError(400, "invalid Content-Length") from None
    if length < 0:
        raise IngestError(400, "invalid Content-Length")
    if length > max_bytes:
        raise IngestError(413, f"body larger than {max_bytes} bytes")
    return length


class BodyReader:
    """The request body as sent (before any Content-Encoding), a file-like reader for
    every ingest path, whether it reads the body whole (``read_body``) or streams it
    (artifacts), used as a context manager around the reading.

    - Content-Length is checked when it is made (``declared_length``). A body sent
      with ``Transfer-Encoding: chunked`` is read from the server's input stream,
      which decodes the chunks: Django reads CONTENT_LENGTH 0 when there is none,
      so its own stream is empty (under ASGI there is no wsgi.input and Django's
      stream holds it all).
    - The whole read is bounded by OBSERVATORY_BODY_READ_TIMEOUT (``_BodyDeadline``),
      from the first read to the end of the body, not per read.
    - Its end is checked where it is met, so nothing of a cut body is stored: the
      read that finds the end raises 400 when fewer bytes came than declared, 408
      when the deadline ended it (a read that fails after the deadline is a 408 too).
    """

    def __init__(self, request: HttpRequest, *, max_bytes: int) -> None:
        self.length = declared_length(request, max_bytes=max_bytes)
        chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
        self._stream = request.META.get("wsgi.input", request) if self.length is None and chunked else request
        self._deadline = _BodyDeadline(request)
        self.size = 0
        self._request = request

    def __enter__(self) -> "BodyReader":
        self._request.ingest_body_read = True  # type: ignore[attr-defined]  # see ``body_discard``
        self._deadline.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._deadline.__exit__()

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = _READ_STEP
        try:
            part = self._stream.read(n)
        except TimeoutError:
            raise IngestError(408, "the body did not arrive in time") from None
        except Exception as exc:
            if self._deadline.expired:  # the watchdog shut the socket under the read
                raise IngestError(408, "the body did not arrive in time") from None
            if isinstance(exc, OSError):  # gunicorn's chunk parser and socket errors
                raise IngestError(400, f"unreadable body: {str(exc)[:100] or type(exc).__name__}") from None
            if type(exc).__module__.startswith("gunicorn."):  # gunicorn.http.errors.*: not OSError
                raise IngestError(400, f"invalid chunked body: {type(exc).__name__}") from None
            raise
        self.size += len(part)
        if not part and n > 0:
            self._ended()
        return part

    def _ended(self) -> None:
        self._deadline.__exit__()  # read to its end: what follows (storing, answering) is not bounded
        if self._deadline.expired:
            raise IngestError(408, "the body did not arrive in time")
        if self.length is not None and self.size < self.length:
            raise IngestError(400, f"body ended after {self.size} of its {self.length} bytes")


def body_discard(request: HttpRequest) -> bool:
    """Read what a request refused before its body was read still sends, and drop it,
    as ``BodyReader`` reads (at most OBSERVATORY_MAX_BODY_BYTES, under the body
    deadline); whether it was read to its end.

    A refusal the sender is told to retry (429, 503: Retry-After) comes back on the
    same keep-alive connection. gunicorn discards an unread body itself only up to
    64 KiB and otherwise closes the connection after the answer without saying so
    (it drops a ``Connection: close`` set by the application), which the exporter
    sees as a transport error on its next request: so the body is read first."""
    if getattr(request, "ingest_body_read", False):
        return True
    try:
        with BodyReader(request, max_bytes=settings.OBSERVATORY_MAX_BODY_BYTES) as body:
            limit = settings.OBSERVATORY_MAX_BODY_BYTES + 1
            while body.size < limit and body.read(min(_READ_STEP, limit - body.size)):
                pass
            return body.size < limit
    except IngestError:
        return False


_READ_STEP = 64 * 1024


def _read_up_to(stream: Any, limit: int) -> bytes:
    """Read until the stream ends or ``limit`` bytes: one read() may return less
    than asked (a chunk, a socket's worth), so loop until it returns nothing."""
    parts = []
    size = 0
    while size < limit:
        part = stream.read(min(_READ_STEP, limit - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)


class _BodyDeadline:
    """Bound the time to read a body on the server's socket (gunicorn puts it in
    ``gunicorn.socket``) to OBSERVATORY_BODY_READ_TIMEOUT, for the whole body: at
    the deadline the watchdog shuts the socket's reading side, so the blocked read
    returns at once and the request is answered 408. A socket timeout alone would
    not do: gunicorn's reader loops over recv() until it has what was asked, and
    a sender dripping a byte a second never lets one recv() time out. gunicorn's
    worker timeout does not cover a gthread worker's busy thread either, so
    without this a stalled sender would hold a thread for good."""

    def __init__(self, request: HttpRequest) -> None:
        self.socket = request.META.get("gunicorn.socket")
        self.entry: list[Any] | None = None

    def __enter__(self) -> "_BodyDeadline":
        if self.socket is not None:
            self.entry = _watchdog.arm(time.monotonic() + settings.OBSERVATORY_BODY_READ_TIMEOUT, self.socket)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.entry is not None:
            _watchdog.disarm(self.entry)

    @property
    def expired(self) -> bool:
        return self.entry is not None and self.entry[_FIRED]


_WHEN, _SEQ, _SOCKET, _ARMED, _FIRED = range(5)


class _Watchdog:
    """One daemon thread per process that shuts the reading side of sockets whose
    body deadline passed. Arming and disarming cost a lock and a heap push; a
    disarmed entry is dropped when it reaches the top."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[list[Any]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None

    def arm(self, when: float, sock: Any) -> list[Any]:
        with self._cond:
            self._seq += 1
            entry = [when, self._seq, sock, True, False]
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="body-deadline", daemon=True)
                self._thread.start()
            if self._heap[0] is entry:
                self._cond.notify()
        return entry

    def disarm(self, entry: list[Any]) -> None:
        with self._cond:
            entry[_ARMED] = False
            entry[_SOCKET] = None

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and not self._heap[0][_ARMED]:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][_WHEN] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                entry = heapq.heappop(self._heap)
                entry[_ARMED], entry[_FIRED] = False, True
                try:
                    entry[_SOCKET].shutdown(socket.SHUT_RD)
                except OSError:
                    pass
                entry[_SOCKET] = None


_watchdog = _Watchdog()


def gunzip_bounded(data: bytes, max_decoded_bytes: int) -> bytes:
    """Inflate gzip (several members allowed) without ever holding more than
    max_decoded_bytes + 1 of output, counting what it inflates against the
    request's memory budget (``memory_reserve``) as it goes."""
    out = bytearray()
    remaining = data
    try:
        while True:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while True:
                step = min(max_decoded_bytes + 1 - len(out), _INFLATE_STEP)
                chunk = inflater.decompress(remaining, step)
                memory_reserve(len(chunk), "the inflated body")
                out += chunk
                if len(out) > max_decoded_bytes:
                    raise IngestError(413, f"decoded body larger than {max_decoded_bytes} bytes")
                remaining = inflater.unconsumed_tail
                if not remaining or inflater.eof:
                    break
            if not inflater.eof:
                raise IngestError(400, "truncated gzip body")
            remaining = inflater.unused_data
            if not remaining.strip(b"\x00"):  # trailing padding is tolerated
                return bytes(out)
    except zlib.error:
        raise IngestError(400, "corrupt gzip body") from None


_INFLATE_STEP = 1024 * 1024


class GunzipReader:
    """A file-like reader that inflates a gzip stream as it is read, for uploads too
    big to hold (artifacts). Output is produced at most ``n`` bytes per read, so the
    caller's size limit bounds memory; corrupt or truncated data raises IngestError
    400. Several gzip members in a row are read as one stream."""

    def __init__(self, stream: Any, chunk_size: int = 64 * 1024) -> None:
        self._stream = stream
        self._chunk_size = chunk_size
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = b""
        self._started = False

    def read(self, n: int = -1) -> bytes:
        n = n if n and n > 0 else self._chunk_size
        while True:
            data, self._pending = self._pending, b""
            if not data:
                data = self._stream.read(self._chunk_size)
                if not data:
                    if self._started and not self._inflater.eof:
                        raise IngestError(400, "truncated gzip body")
                    return b""
            if self._inflater.eof:  # a new member begins (padding after the last is fine)
                if not data.strip(b"\x00"):
                    continue
                self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._started = True
            try:
                out = self._inflater.decompress(data, n)
            except zlib.error:
                raise IngestError(400, "corrupt gzip body") from None
            self._pending = self._inflater.unconsumed_tail or self._inflater.unused_data
            if out:
                return out


_STRING = re.compile(rb'"[^"]*"')
_EMPTY_PAIR = re.compile(rb"\[\]|\{\}")
# Every byte but the quote and the brackets, for bytes.translate to delete.
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'"[]{}'))
_SUSPICIOUS_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def load_json(body: bytes, *, max_depth: int = DEFAULT_JSON_DEPTH) -> Any:
    """Parse a JSON body: strict UTF-8, nesting capped at max_depth, and strings
    that a database cannot hold (NUL, unpaired surrogates) replaced by U+FFFD.

    The depth is measured on the text, after it parsed (so it is valid JSON), all
    in C-speed calls: see ``_too_deep``.
    """
    memory_reserve(json_decode_cost(body), "the JSON body")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise IngestError(400, "body is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise IngestError(400, f"JSON nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise IngestError(400, f"invalid JSON: {str(exc)[:120]}") from None
    if _too_deep(body, max_depth):
        raise IngestError(400, f"JSON nested deeper than {max_depth} levels")
    if _SUSPICIOUS_ESCAPE.search(body):
        value = _clean_strings(value)
    return value


def _refuse_constant(name: str) -> Any:
    # NaN and ±Infinity are not JSON; Python reads them, a database column would not.
    raise ValueError(f"{name} is not a JSON value")


def _too_deep(body: bytes, max_depth: int) -> bool:
    """Whether brackets outside strings nest deeper than max_depth in valid JSON.

    Escapes go first (escaped backslashes, then escaped quotes: what is left of a
    backslash escapes neither), then every byte but quotes and brackets. Quotes
    now alternate open/close around strings holding only brackets; two adjacent
    quotes are an empty string or the seam of two strings, so removing them keeps
    every bracket where it was, in or out of a string, and leaves the regex that
    removes the strings little to do. Then matching bracket pairs are peeled one
    level per pass.
    """
    structure = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    brackets = _STRING.sub(b"", structure.replace(b'""', b""))
    for _ in range(max_depth):
        if not brackets:
            return False
        brackets = _EMPTY_PAIR.sub(b"", brackets)  # one level: only pairs empty before this pass
    return bool(brackets)


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _clean_text(text: str) -> str:
    return _UNSTORABLE.sub("\ufffd", text)


def _clean_strings(value: Any) -> Any:
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, list):
        return [_clean_strings(item) for item in value]
    if isinstance(value, dict):
        return {_clean_text(k): _clean_strings(v) for k, v in value.items()}
    return value


# --- answers ----------------------------------------------------------------------

def error_response(
    exc: IngestError, *, content_type: str = "application/json", body: bytes | None = None,
    request: HttpRequest | None = None,
) -> HttpResponse:
    """A short error answer: ``{"error": "..."}`` unless the caller brings an encoded
    body of its own (OTLP answers a protobuf Status), with Retry-After when set.
    Given the ``request``, a refusal to retry (Retry-After) made before the body was
    read reads it first (``body_discard``), so the connection carries the retry."""
    if request is not None and exc.retry_after is not None:
        body_discard(request)
    if body is None:
        body = json.dumps({"error": exc.message}).encode()
        content_type = "application/json"
    response = HttpResponse(body, status=exc.status, content_type=content_type)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


# --- load -------------------------------------------------------------------------

GATE_WAIT = 0.1  # seconds a request waits for a place in a full ingest gate
BACKLOG_READ_EVERY = 1.0  # seconds a process reuses what it read of the derivations' backlog
BACKLOG_RETRY_AFTER = 2  # seconds
_gate_free = threading.Condition()
_gate_in_use = 0
_gate_waiting = 0  # requests waiting for a place (so a release without waiters notifies nobody)
_memory_lock = threading.Lock()
_memory_in_use = 0
_request_memory = threading.local()  # .held: bytes this thread's request reserved; None outside the gate


@contextmanager
def ingest_gate(batch: IngestBatch | None = None) -> Iterator[None]:
    """Bound concurrent ingest requests in this process; past the bound (after a
    wait of at most GATE_WAIT for a place) answer 429 with Retry-After so
    exporters back off instead of piling onto the database.
    Inside, ``memory_reserve`` counts what the request decodes against the
    process's ingest memory budget, released when the request ends. A database
    error inside is a 503 with Retry-After when the database is busy, a 500 when
    it is broken, logged and counted with ``batch`` (what the request filled in
    of it by then; see ``database_errors_refused``)."""
    global _gate_in_use, _gate_waiting
    limit = settings.OBSERVATORY_MAX_CONCURRENT_INGEST
    with _gate_free:
        if _gate_in_use >= limit and limit > 0 and not _gate_waiting and not pages_in_progress():
            # Full: one request at a time waits a moment for a place before
            # refusing. Small batches hold one for a few milliseconds, so with
            # more senders than places (16 senders, 4 processes x 3) the wait is
            # short, where a 429 costs the sender a whole second (Retry-After is
            # in seconds) of doing nothing. Only one waits, so the thread left
            # for the pages is taken for at most GATE_WAIT, and none waits while
            # a page runs here; big batches hold a place longer than the wait
            # and are refused as before.
            _gate_waiting += 1
            try:
                _gate_free.wait_for(lambda: _gate_in_use < limit, timeout=GATE_WAIT)
            finally:
                _gate_waiting -= 1
        if _gate_in_use >= limit:
            raise IngestError(429, "too many concurrent ingest requests", retry_after=1)
        _gate_in_use += 1
    _request_memory.held = 0
    # No CONN_HEALTH_CHECKS query (a round trip on PostgreSQL) before the first
    # statement: the first statement in here is the key's read, which reconnects
    # once by itself when the connection was dropped (``_key_row``); a later
    # database error is a 503 with Retry-After (or a 500: ``database_refusal``), and
    # Django closes the connection at the end of the request (close_old_connections,
    # also around every gRPC export).
    connection.health_check_done = True
    try:
        with database_errors_refused(batch or IngestBatch(IngestTransport.API)):
            yield
    finally:
        _memory_release()
        with _gate_free:
            _gate_in_use -= 1
            if _gate_waiting:
                _gate_free.notify()


_backlog_lock = threading.Lock()
_backlog_read = (float("-inf"), 0.0)  # (monotonic time read, seconds behind)


def derivations_keep_up() -> None:
    """Refuse a batch (429, Retry-After) while the derivations are more than
    OBSERVATORY_DERIVE_BACKLOG_SECONDS behind. Called after the key is checked,
    before the body is read.

    Ingest can store spans faster than one drainer derives them: on SQLite, in a
    16-minute soak offering 20,000 spans/s, the server stored 10,000-13,000 a
    second while the notes waiting grew without end (30,171 at the end, nothing
    converged minutes later), and a page showed conversations minutes old. Slowed
    to what the derivations keep up with, exporters hold and resend their batches
    (nothing acknowledged is lost), and the lag stays about this bound. The
    backlog is read at most once every BACKLOG_READ_EVERY seconds per process.
    """
    global _backlog_read
    limit = settings.OBSERVATORY_DERIVE_BACKLOG_SECONDS
    if limit <= 0:
        return
    now = time.monotonic()
    with _backlog_lock:
        read_at, behind = _backlog_read
        if now - read_at >= BACKLOG_READ_EVERY:
            from dashboard.observatory.derive.notes import backlog_seconds

            behind = reconnecting(backlog_seconds)
            _backlog_read = (now, behind)
    if behind > limit:
        raise IngestError(429, f"derivations are {behind:.0f} s behind; send again later",
                          retry_after=BACKLOG_RETRY_AFTER)


def memory_reserve(nbytes: int, what: str) -> None:
    """Count ``nbytes`` that decoding is about to allocate against this process's
    ingest memory budget (OBSERVATORY_INGEST_MEMORY_BYTES), before allocating them.

    A request that alone would pass the budget is refused with 413 (it can never
    fit: send smaller batches); one that fits but finds the budget taken by
    requests in flight gets 503 with Retry-After. So a worker holds at most about
    the budget in decoded ingest data, whatever its clients send. Outside
    ``ingest_gate`` (management commands, the derivations) nothing is counted.
    """
    global _memory_in_use
    held = getattr(_request_memory, "held", None)
    if held is None or nbytes <= 0:
        return
    budget = settings.OBSERVATORY_INGEST_MEMORY_BYTES
    if held + nbytes > budget:
        raise IngestError(
            413,
            f"{what} would take about {(held + nbytes) // 2**20 + 1} MiB to decode, more than the "
            f"{budget // 2**20} MiB one request may use: send smaller batches",
        )
    with _memory_lock:
        if _memory_in_use + nbytes > budget:
            raise IngestError(503, "ingest memory in use by other requests, retry later", retry_after=BUSY_RETRY_AFTER)
        _memory_in_use += nbytes
    _request_memory.held = held + nbytes


def _memory_release() -> None:
    global _memory_in_use
    held = getattr(_request_memory, "held", None) or 0
    _request_memory.held = None
    with _memory_lock:
        _memory_in_use -= held


def memory_in_use() -> int:
    """Bytes reserved by the ingest requests in flight in this process."""
    return _memory_in_use


# Measured with json.loads on OTLP attributes, records and number arrays: a value
# takes up to ~135 bytes of objects, strings about twice their text.
_JSON_BYTES_PER_VALUE = 140


def json_decode_cost(body: bytes) -> int:
    """What parsing ``body`` as JSON will allocate, estimated from the text at C
    speed: twice its size plus a value's objects per comma, object or array."""
    values = body.count(b",") + body.count(b"{") + body.count(b"[") + 1
    return 2 * len(body) + _JSON_BYTES_PER_VALUE * values


@dataclass(slots=True)
class IngestBatch:
    """What a batch that a broken database failed is logged and counted with: its
    transport, and what the request has learnt of it by then (filled in as it goes)."""

    transport: str
    project_id: int | None = None  # None until the key was read
    items: int | None = None  # spans, log records or records; None until decoded
    item_name: str = "items"
    nbytes: int | None = None  # the body, decoded; None until read
    signal: str = ""  # traces or logs, for OTLP


class DatabaseBroken(IngestError):
    """A 500 for a batch the database failed for a reason of its own (a missing
    table, a constraint, a bad value): sending it again would fail the same way.
    The answer names nothing internal; ``cause`` (the driver's error) goes to the
    log, once (``database_broken_report``)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(500, "internal error: the batch was not stored")
        self.cause = cause
        self.reported = False


@contextmanager
def database_errors_refused(batch: IngestBatch | None = None) -> Iterator[None]:
    """Turn a database error into its refusal (``database_refusal``): the write was
    rolled back, nothing of the batch is stored. With ``batch``, a broken database
    is logged and counted with it (also a ``DatabaseBroken`` raised by an inner use
    of this without one): the outermost use, where the request is known, reports.

    Wrap the transaction with it: ``with database_errors_refused(batch), transaction.atomic(): ...``
    """
    try:
        yield
    except DatabaseError as exc:
        raise database_refusal(exc, batch) from None
    except DatabaseBroken as exc:
        if batch is not None:
            database_broken_report(exc, batch)
        raise


def database_refusal(exc: BaseException, batch: IngestBatch | None = None) -> IngestError:
    """The refusal of a batch whose transaction failed on the database (rolled back):
    a busy database (``database_busy``, the rule the outbox retries by: a lock, a
    deadlock, a lost connection) is a 503 with Retry-After, the sender tries again;
    any other database error is a 500 (``DatabaseBroken``), reported with ``batch``
    when given. Senders retry a 503 until it passes, so one for an error that
    never passes would have them send the batch forever."""
    if database_busy(exc):
        return busy_error()
    broken = DatabaseBroken(exc)
    if batch is not None:
        database_broken_report(broken, batch)
    return broken


def busy_error() -> IngestError:
    """The refusal of a batch whose transaction failed on a busy database (rolled back)."""
    return IngestError(503, "database busy, retry later", retry_after=BUSY_RETRY_AFTER)


def database_broken_report(error: DatabaseBroken, batch: IngestBatch) -> None:
    """Log a batch a broken database failed, once, at ERROR, with its size and
    project, and count it for the admin (``IngestDatabaseFault``)."""
    if error.reported:
        return
    error.reported = True
    cause = error.cause
    size = "size unknown" if batch.items is None else f"{batch.items} {batch.item_name}"
    if batch.nbytes is not None:
        size += f", {batch.nbytes} bytes"
    what = f"{batch.transport} {batch.signal}".strip()
    project = "unknown" if batch.project_id is None else batch.project_id
    logger.error("ingest %s: database error, batch of project %s not stored (%s); answered 500",
                 what, project, size, exc_info=(type(cause), cause, cause.__traceback__))
    _fault_count(batch, cause)


def _fault_count(batch: IngestBatch, cause: BaseException) -> None:
    """One more broken-database answer for the batch's project, transport and day,
    in a transaction of its own (the batch's was rolled back). Never raises: the
    database that just failed may fail this too (it is logged then)."""
    now = timezone.now()
    rows = IngestDatabaseFault.objects.filter(day=now.date(), transport=batch.transport)
    rows = rows.filter(project__isnull=True) if batch.project_id is None else rows.filter(project_id=batch.project_id)
    driver = cause.__cause__ or cause
    error_type = f"{type(driver).__module__}.{type(driver).__qualname__}"[:200]

    def count() -> None:
        with transaction.atomic():
            if not rows.update(count=F("count") + 1, last_at=now, last_error=error_type):
                IngestDatabaseFault.objects.create(project_id=batch.project_id, day=now.date(),
                                                   transport=batch.transport, count=1, last_at=now,
                                                   last_error=error_type)

    try:
        try:
            count()
        except IntegrityError:  # another process counted the day's first at the same time
            count()
    except DatabaseError:
        logger.warning("ingest %s: could not count a broken-database answer", batch.transport, exc_info=True)
