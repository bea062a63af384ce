"""The exporters' optional on-disk spool: an append-only journal in a directory.

What is queued for the dashboard is also written here, so an outage longer than the
memory queue can hold, or a restart of the agent, loses nothing. Only the exporter's
own thread calls it: the agent thread never touches the disk.

Layout: ``segment-<n>.spool`` files, each a run of frames::

    magic "PJ" | kind (1 byte) | length (u32) | crc32 (u32) | seq (u64) | payload

An ENTRY frame holds one queued item (a record's JSON, a span's protobuf) under a
sequence number that grows across segments; a DONE frame lists sequence ranges that
need no replay any more (delivered, refused or dropped). Appends go to the newest
segment, which is sealed at ``segment_bytes``; a segment whose entries are all done
is deleted, oldest first, so a DONE frame never outlives the entries it cancels.

Thread-safe: the spooling thread appends while the sending thread marks entries done.

Crash safety: each frame is written with one ``write`` call and checked by its CRC on
replay. A torn last frame (a crash mid-write) or a damaged one ends the reading of its
segment and is skipped; the exporter never appends after it (each start opens a new
segment). ``fsync``: ``"batch"`` (default) syncs once per exporter cycle (at most every
``interval``), ``"always"`` after every write, ``"never"`` leaves it to the OS. A
process crash (``kill -9``) loses nothing already written whatever the policy; fsync
only matters when the machine itself goes down.

Failure is never the agent's problem: a directory that cannot be created, locked or
written (permission denied, disk full, in use by another exporter) disables the spool
with one warning and the exporter carries on in memory.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import re
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

try:  # POSIX; elsewhere the lock is skipped (one exporter per directory is then on you)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("pipeline.exporter")

FsyncPolicy = Literal["batch", "always", "never"]
FSYNC_POLICIES = ("batch", "always", "never")

_HEADER = struct.Struct("<2sBIIQ")  # magic, kind, payload length, crc32, seq
_MAGIC = b"PJ"
_ENTRY, _DONE = 1, 2
_RANGE = struct.Struct("<QQ")
_SEGMENT = re.compile(r"^segment-(\d{10})\.spool$")
MAX_FRAME_BYTES = 64 * 1024 * 1024  # a length above this is damage, not data


@dataclass
class _Segment:
    number: int
    first_seq: int  # the first sequence number written to it (or that would be)
    size: int = 0
    live: int = 0  # entries not done yet


def _frame(kind: int, seq: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(struct.pack("<BQ", kind, seq)))
    return _HEADER.pack(_MAGIC, kind, len(payload), crc, seq) + payload


def _ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged inclusive ranges of the given sequence numbers."""
    ranges: list[list[int]] = []
    for seq in sorted(set(seqs)):
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1][1] = seq
        else:
            ranges.append([seq, seq])
    return [(a, b) for a, b in ranges]


def _locked(method: Any) -> Any:
    @functools.wraps(method)
    def locked(self: Spool, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


def read_frames(data: bytes) -> tuple[list[tuple[int, int, bytes]], bool]:
    """The intact frames of one segment's bytes, and whether a damaged or torn frame
    ended the reading early."""
    frames: list[tuple[int, int, bytes]] = []
    offset, end = 0, len(data)
    while offset < end:
        if end - offset < _HEADER.size:
            return frames, True
        magic, kind, length, crc, seq = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        if magic != _MAGIC or kind not in (_ENTRY, _DONE) or length > MAX_FRAME_BYTES or start + length > end:
            return frames, True
        payload = data[start : start + length]
        if zlib.crc32(payload, zlib.crc32(struct.pack("<BQ", kind, seq))) != crc:
            return frames, True
        frames.append((kind, seq, payload))
        offset = start + length
    return frames, False


class Spool:
    """One exporter's journal directory."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 256 * 1024 * 1024,
        segment_bytes: int = 8 * 1024 * 1024,
        fsync: FsyncPolicy = "batch",
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}")
        if max_bytes < 1 or segment_bytes < 1:
            raise ValueError("max_bytes and segment_bytes must be positive")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.enabled = False
        self.spooled = 0  # entries written
        self.skipped = 0  # entries not written: the spool was full or off
        self.errors = 0
        self.torn = 0  # damaged or torn frames skipped on replay
        self.replayed = 0
        self._segments: list[_Segment] = []  # oldest first; the last one is appended to
        self._active_fd: Optional[int] = None
        self._lock_fd: Optional[int] = None
        self._next_seq = 1
        self._dirty = False
        self._warned_full = False
        self._lock = threading.RLock()

    # --- lifecycle ----------------------------------------------------------------

    @_locked
    def open(self) -> list[tuple[int, bytes]]:
        """Lock the directory, read what a previous exporter left, start a new
        segment; return the entries still to deliver as (seq, payload), oldest first.
        On any failure the spool stays off and nothing is returned."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._lock_fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            if fcntl is not None:
                try:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise OSError("the spool directory is in use by another exporter") from None
            pending = self._replay()
            self._start_segment()
        except OSError as exc:
            self._fail("could not be opened", exc)
            return []
        self.enabled = True
        self.replayed = len(pending)
        return pending

    @_locked
    def close(self) -> None:
        for fd in (self._active_fd, self._lock_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._active_fd = self._lock_fd = None
        self.enabled = False

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(segment.size for segment in self._segments)

    # --- writing ------------------------------------------------------------------

    @_locked
    def append(self, payloads: list[bytes]) -> list[Optional[int]]:
        """Write entries in one call; each gets its sequence number, or None when it
        was not spooled (spool off or full: it then lives in memory only)."""
        seqs: list[Optional[int]] = [None] * len(payloads)
        if not self.enabled:
            self.skipped += len(payloads)
            return seqs
        chunks: list[bytes] = []
        room = self.max_bytes - self.size_bytes
        first = self._next_seq
        for index, payload in enumerate(payloads):
            frame = _frame(_ENTRY, self._next_seq, payload)
            if len(frame) > room:
                self.skipped += 1
                if not self._warned_full:
                    self._warned_full = True
                    logger.warning("spool %s is full (%d bytes); newer records are kept in memory only",
                                   self.directory.name, self.max_bytes)
                continue
            room -= len(frame)
            chunks.append(frame)
            seqs[index] = self._next_seq
            self._next_seq += 1
        if chunks and self._write(b"".join(chunks)):
            active = self._segments[-1]
            active.live += self._next_seq - first
            self.spooled += self._next_seq - first
        elif chunks:
            return [None] * len(payloads)
        return seqs

    @_locked
    def done(self, seqs: Iterable[Optional[int]]) -> None:
        """Mark entries as needing no replay; delete segments that became empty."""
        real = [seq for seq in seqs if seq is not None]
        if not self.enabled or not real:
            return
        ranges = _ranges(real)
        payload = b"".join(_RANGE.pack(a, b) for a, b in ranges)
        if not self._write(_frame(_DONE, 0, payload)):
            return
        firsts = [segment.first_seq for segment in self._segments]
        for seq in real:
            index = bisect.bisect_right(firsts, seq) - 1
            if index >= 0:
                self._segments[index].live -= 1
        self._compact()

    @_locked
    def commit(self) -> None:
        """End of one exporter cycle: fsync under the "batch" policy."""
        if self.enabled and self._dirty and self.fsync == "batch":
            self._sync()

    # --- internals ----------------------------------------------------------------

    def _write(self, data: bytes) -> bool:
        if self._segments[-1].size >= self.segment_bytes:
            try:
                self._start_segment()
            except OSError as exc:
                self._fail("could not start a new segment", exc)
                return False
        try:
            written = os.write(self._active_fd, data)  # type: ignore[arg-type]
            if written != len(data):  # a short write (disk full): the tail is torn
                raise OSError(f"short write ({written} of {len(data)} bytes)")
        except OSError as exc:
            self._fail("could not be written", exc)
            return False
        self._segments[-1].size += len(data)
        self._dirty = True
        if self.fsync == "always":
            self._sync()
        return True

    def _sync(self) -> None:
        try:
            os.fsync(self._active_fd)  # type: ignore[arg-type]
            self._dirty = False
        except OSError as exc:
            self._fail("could not be synced", exc)

    def _start_segment(self) -> None:
        number = self._segments[-1].number + 1 if self._segments else 1
        path = self.directory / f"segment-{number:010d}.spool"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
        if self._active_fd is not None:
            if self.fsync != "never":
                os.fsync(self._active_fd)
            os.close(self._active_fd)
        self._active_fd = fd
        self._segments.append(_Segment(number, self._next_seq))
        self._sync_directory()
        self._compact()

    def _compact(self) -> None:
        # Oldest first only: a DONE frame in a newer segment may cancel entries of an
        # older one, so a newer segment must not go before the older ones it covers.
        while len(self._segments) > 1 and self._segments[0].live <= 0:
            segment = self._segments.pop(0)
            try:
                (self.directory / f"segment-{segment.number:010d}.spool").unlink(missing_ok=True)
            except OSError as exc:
                self._fail("could not delete a delivered segment", exc)
                return

    def _sync_directory(self) -> None:
        if self.fsync == "never":
            return
        try:
            fd = os.open(self.directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _replay(self) -> list[tuple[int, bytes]]:
        entries: dict[int, bytes] = {}
        owner: dict[int, int] = {}  # seq -> index in self._segments
        numbers = sorted(
            int(match.group(1)) for name in os.listdir(self.directory) if (match := _SEGMENT.match(name))
        )
        budget = self.max_bytes * 2  # never read more than a spool this size can hold
        for number in numbers:
            path = self.directory / f"segment-{number:010d}.spool"
            data = path.read_bytes()[: max(0, budget)]
            budget -= len(data)
            frames, damaged = read_frames(data)
            if damaged:
                self.torn += 1
                logger.warning("spool %s: a damaged or torn entry was skipped (crash mid-write?)", path.name)
            # Sequence numbers only grow, so this segment's entries start at _next_seq.
            segment = _Segment(number, self._next_seq, len(data))
            for kind, seq, payload in frames:
                if kind == _ENTRY:
                    entries[seq] = payload
                    owner[seq] = len(self._segments)
                    self._next_seq = max(self._next_seq, seq + 1)
                    continue
                for offset in range(0, len(payload) - _RANGE.size + 1, _RANGE.size):
                    low, high = _RANGE.unpack_from(payload, offset)
                    if high - low < len(entries):
                        for seq in range(low, high + 1):
                            entries.pop(seq, None)
                    else:
                        for seq in [s for s in entries if low <= s <= high]:
                            del entries[seq]
            self._segments.append(segment)
        for seq in entries:
            self._segments[owner[seq]].live += 1
        return sorted(entries.items())

    def _fail(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        if self.errors == 1:
            logger.warning("spool %s %s (%s); continuing in memory only", self.directory, what, exc)
        self.close()
