"""Sandboxed artifact store (seeds v2.0 "File Cleanup Strategy", v2.1 "文件存储规则").

Large tool outputs are stored under an ``artifact_id`` and the model only ever
sees that id, never a path. Rules kept here:

- Ids are content addresses: ``artifact_`` + the full sha256 hex of the bytes.
  Storing identical bytes again returns the same artifact (one file): its expiry
  and access time are refreshed, content type and tool_call_id take the new
  values, created_at stays.
- Every id is validated before it touches the file system; files are flat in the
  root (``<id>.bin`` + a ``<id>.json`` metadata sidecar), written atomically
  (temp file + ``os.replace``), opened with O_NOFOLLOW and checked to be regular
  files inside the root, so a planted symlink is refused.
- The sidecar makes metadata survive a restart; a corrupt one is skipped with a
  warning. Last access is the data file's mtime (one ``utime`` per read, no
  sidecar rewrite), so LRU order survives a restart too.
- No real path appears in any message, exception, log line or repr.
- Cleanup: expired artifacts (TTL), and when the total passes ``max_total_bytes``
  the least recently accessed go until the total is at most
  ``low_water_ratio * max_total_bytes`` (the seeds' loop never stopped early).

- Conversations (v2.1 "会话结束清理"): an artifact stored for a conversation is
  removed when the last conversation that stored it ends (``cleanup_conversation``);
  artifacts stored without one live until their TTL.
- The cleaner runs by default: the first ``store`` enrols the store with one
  process-wide daemon thread (its first pass one interval later), which holds the
  stores weakly and ends when none is left; ``close``/``stop_cleaner`` stop it.
- Stores on the same folder (in one process or several) see each other's
  artifacts: a miss re-reads that id's sidecar, ``list`` and the cleanups rescan.

``open_store(path)`` gives one store per root per process (what a ``storage_dir``
path resolves to); the store is thread-safe.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import datetime as dt
import decimal
import enum
import errno
import hashlib
import json
import logging
import math
import os
import re
import secrets
import stat
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from pathlib import Path, PurePath
from typing import Any, Callable, Optional, Union

from ._config import require
from ._exceptions import ArtifactError, ArtifactNotFound, InvalidArtifactId

logger = logging.getLogger(__name__)

#: The form of an artifact id, unanchored (for URL converters and searching text) and anchored.
ARTIFACT_ID_PATTERN = "artifact_[0-9a-f]{16,64}"
ARTIFACT_ID_RE = f"^{ARTIFACT_ID_PATTERN}$"
_ARTIFACT_ID = re.compile(ARTIFACT_ID_RE)
_MAX_ID_LENGTH = len("artifact_") + 64
#: Data of this size or more goes to the store instead of the observation (the
#: executor decides; seeds v2.1 "data_size >= 1MB").
THRESHOLD_BYTES = 1024 * 1024
DEFAULT_TTL_SECONDS = 86400.0
DEFAULT_MAX_TOTAL_BYTES = 1024**3
DEFAULT_CLEAN_INTERVAL_SECONDS = 3600.0

_DATA_SUFFIX = ".bin"
_META_SUFFIX = ".json"
_TMP_PREFIX = ".tmp-"
_STALE_TMP_SECONDS = 3600
_MAX_SIDECAR_BYTES = 64 * 1024
_CONTENT_TYPE = re.compile(r"^[\x21-\x7e][\x20-\x7e]{0,199}$")
_FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_EXTENSIONS = {"application/json": "json", "text/plain": "txt", "text/csv": "csv"}
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)


def _shown(value: str) -> str:
    """A short, escaped excerpt of hostile input for an error message."""
    return repr(value[:40]) + ("…" if len(value) > 40 else "")


def validate_artifact_id(value: Any) -> str:
    """Return ``value`` if it is ``artifact_`` + 16-64 lowercase hex digits;
    otherwise raise InvalidArtifactId saying what is wrong (input never echoed
    in full)."""
    if not isinstance(value, str):
        raise InvalidArtifactId(f"artifact id must be a string, not {type(value).__name__}")
    if len(value) > _MAX_ID_LENGTH:
        raise InvalidArtifactId(f"artifact id is too long ({len(value)} characters, at most {_MAX_ID_LENGTH})")
    if "\x00" in value:
        raise InvalidArtifactId("artifact id contains a NUL byte")
    if value.startswith(("/", "\\")) or PurePath(value).is_absolute() or re.match(r"^[A-Za-z]:", value):
        raise InvalidArtifactId(f"artifact id must not be an absolute path: {_shown(value)}")
    if ".." in value or "/" in value or "\\" in value:
        raise InvalidArtifactId(f"artifact id must not contain path separators or '..': {_shown(value)}")
    if not _ARTIFACT_ID.fullmatch(value):
        raise InvalidArtifactId(
            f"artifact id must be 'artifact_' followed by 16-64 lowercase hex digits: {_shown(value)}"
        )
    return value


def _utc(ts: Optional[float]) -> Optional[dt.datetime]:
    return None if ts is None else dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)


@dataclasses.dataclass(frozen=True)
class ArtifactInfo:
    """What is known about one stored artifact (no path: the id is the handle)."""

    artifact_id: str
    size_bytes: int
    sha256: str
    content_type: str
    created_at: dt.datetime
    last_accessed_at: dt.datetime
    expires_at: Optional[dt.datetime]
    tool_call_id: Optional[str] = None
    filename: Optional[str] = None
    conversation_ids: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["conversation_ids"] = builtins.list(self.conversation_ids)
        for key in ("created_at", "last_accessed_at", "expires_at"):
            data[key] = data[key].isoformat() if data[key] is not None else None
        return data


@dataclasses.dataclass
class _Meta:
    """The sidecar's content; times are clock seconds (epoch)."""

    artifact_id: str
    size_bytes: int
    sha256: str
    content_type: str
    created_at: float
    expires_at: Optional[float]
    tool_call_id: Optional[str]
    filename: Optional[str]
    conversation_ids: builtins.list[str] = dataclasses.field(default_factory=builtins.list)
    last_accessed_at: float = 0.0  # from the data file's mtime, not the sidecar

    def sidecar(self) -> bytes:
        data = dataclasses.asdict(self)
        del data["last_accessed_at"]
        return json.dumps(data, sort_keys=True).encode("utf-8")

    @classmethod
    def from_sidecar(cls, raw: bytes, artifact_id: str) -> "_Meta":
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("artifact_id") != artifact_id:
            raise ValueError("sidecar does not describe this artifact")
        meta = cls(
            artifact_id=artifact_id,
            size_bytes=data["size_bytes"],
            sha256=data["sha256"],
            content_type=data["content_type"],
            created_at=data["created_at"],
            expires_at=data["expires_at"],
            tool_call_id=data.get("tool_call_id"),
            filename=data.get("filename"),
            conversation_ids=data.get("conversation_ids", []),
        )
        numbers_ok = (
            isinstance(meta.size_bytes, int)
            and meta.size_bytes >= 0
            and isinstance(meta.created_at, (int, float))
            and (meta.expires_at is None or isinstance(meta.expires_at, (int, float)))
        )
        texts_ok = (
            isinstance(meta.sha256, str)
            and re.fullmatch(r"[0-9a-f]{64}", meta.sha256) is not None
            and isinstance(meta.content_type, str)
            and _CONTENT_TYPE.match(meta.content_type) is not None
            and (meta.tool_call_id is None or isinstance(meta.tool_call_id, str))
            and (meta.filename is None or isinstance(meta.filename, str))
            and isinstance(meta.conversation_ids, builtins.list)
            and all(isinstance(c, str) for c in meta.conversation_ids)
        )
        if not (numbers_ok and texts_ok):
            raise ValueError("sidecar fields have the wrong types")
        return meta

    def info(self) -> ArtifactInfo:
        return ArtifactInfo(
            artifact_id=self.artifact_id,
            size_bytes=self.size_bytes,
            sha256=self.sha256,
            content_type=self.content_type,
            created_at=_utc(self.created_at),  # type: ignore[arg-type]
            last_accessed_at=_utc(self.last_accessed_at),  # type: ignore[arg-type]
            expires_at=_utc(self.expires_at),
            tool_call_id=self.tool_call_id,
            filename=self.filename,
            conversation_ids=tuple(self.conversation_ids),
        )


# --- JSON for anything ----------------------------------------------------------


def _json_default(value: Any) -> Any:
    """json.dumps ``default=``: common non-JSON types, then ``str`` as the last word."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)  # keeps every digit
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (set, frozenset)):
        items = list(value)
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        try:
            return model_dump(mode="json")
        except Exception:
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return str(value)


def _jsonable(value: Any, depth: int = 0, seen: Optional[set[int]] = None) -> Any:
    """Slow path for what json.dumps refuses even with ``default``: NaN/Infinity,
    cycles, non-string keys, absurd nesting."""
    seen = set() if seen is None else seen
    if depth > 200:
        return "<too deep>"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (dict, list, tuple)):
        if id(value) in seen:
            return "<cycle>"
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                return {
                    (k if isinstance(k, str) else str(k)): _jsonable(v, depth + 1, seen) for k, v in value.items()
                }
            return [_jsonable(v, depth + 1, seen) for v in value]
        finally:
            seen.discard(id(value))
    return _jsonable(_json_default(value), depth + 1, seen)


def _to_json_bytes(value: Any) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_default)
    except (ValueError, TypeError, RecursionError):
        text = json.dumps(_jsonable(value), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8", "surrogatepass")


def _encode_payload(data: Any) -> tuple[bytes, str]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data), "application/octet-stream"
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass"), "text/plain; charset=utf-8"
    return _to_json_bytes(data), "application/json"


# --- the store ---------------------------------------------------------------------


class ArtifactStore:
    """Stores bytes under content ids in a sandbox directory; see the module docstring."""

    def __init__(
        self,
        root: Union[str, os.PathLike[str]],
        *,
        ttl_seconds: Optional[float] = DEFAULT_TTL_SECONDS,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        low_water_ratio: float = 0.8,
        clock: Callable[[], float] = time.time,
        auto_clean: bool = True,
        clean_interval_seconds: float = DEFAULT_CLEAN_INTERVAL_SECONDS,
    ) -> None:
        require(
            ttl_seconds is None
            or (isinstance(ttl_seconds, (int, float)) and not isinstance(ttl_seconds, bool) and ttl_seconds > 0),
            "ttl_seconds",
            "must be a positive number of seconds or None",
        )
        require(
            isinstance(max_total_bytes, int) and not isinstance(max_total_bytes, bool) and max_total_bytes > 0,
            "max_total_bytes",
            "must be a positive integer",
        )
        require(
            isinstance(low_water_ratio, (int, float)) and 0 < low_water_ratio <= 1,
            "low_water_ratio",
            "must be in (0, 1]",
        )
        require(callable(clock), "clock", "must be callable")
        _check_interval(clean_interval_seconds, "clean_interval_seconds")
        self._auto_clean = bool(auto_clean)
        self._clean_interval = float(clean_interval_seconds)
        self._ttl = None if ttl_seconds is None or math.isinf(ttl_seconds) else float(ttl_seconds)
        self._max_total = max_total_bytes
        self._low_water = int(max_total_bytes * low_water_ratio)
        self._clock = clock
        self._root = Path(root).resolve()
        try:
            self._root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactError(f"cannot create the artifact root ({exc.strerror})") from None
        if not self._root.is_dir():
            raise ArtifactError("the artifact root is not a directory")
        _unlink_quietly(self._write_temp(b""))  # unusable root: say so now, not at the first store
        self._lock = threading.RLock()
        self._index: dict[str, _Meta] = {}
        self._total = 0
        self._cleaner_enrolled = False  # on the process's cleaner thread
        self._cleaner_stopped = False  # stopped by the caller: no automatic restart
        self._cleaner_explicit = False  # started by start_cleaner (not at the first store)
        self._load()

    # --- public API -------------------------------------------------------------

    @property
    def total_bytes(self) -> int:
        return self._total

    def store(
        self,
        data: Any,
        *,
        content_type: Optional[str] = None,
        tool_call_id: Optional[str] = None,
        filename: Optional[str] = None,
        conversation_id: Optional[str] = None,
    ) -> ArtifactInfo:
        """Store ``data``: bytes as is, str as UTF-8 text/plain, anything else as
        JSON (application/json; never fails on odd values). Returns its info.

        With ``conversation_id`` the artifact is removed when that conversation
        ends (``cleanup_conversation``), unless another live conversation stored it too."""
        payload, default_type = _encode_payload(data)
        if conversation_id is not None:
            require(
                isinstance(conversation_id, str) and 0 < len(conversation_id) <= 256,
                "conversation_id",
                "must be 1-256 characters",
            )
        if self._auto_clean and not self._cleaner_enrolled and not self._cleaner_stopped:
            _CLEANER.enrol(self, self._clean_interval, run_now=False)
            self._cleaner_enrolled = True
        content_type = self._checked_content_type(content_type or default_type)
        if tool_call_id is not None:
            require(isinstance(tool_call_id, str) and 0 < len(tool_call_id) <= 256, "tool_call_id", "must be 1-256 characters")
        if len(payload) > self._max_total:
            raise ArtifactError(f"artifact of {len(payload)} bytes exceeds the store limit of {self._max_total} bytes")
        sha = hashlib.sha256(payload).hexdigest()
        artifact_id = f"artifact_{sha}"
        filename = self._filename_hint(filename, artifact_id, content_type)
        now = self._clock()
        expires_at = None if self._ttl is None else now + self._ttl

        tmp = self._write_temp(payload)  # outside the lock: big writes run in parallel
        try:
            with self._lock:
                old = self._index.get(artifact_id) or self._load_one(artifact_id)
                conversations = builtins.list(old.conversation_ids) if old else []
                if conversation_id is not None and conversation_id not in conversations:
                    conversations.append(conversation_id)
                meta = _Meta(
                    artifact_id=artifact_id,
                    size_bytes=len(payload),
                    sha256=sha,
                    content_type=content_type,
                    created_at=old.created_at if old else now,
                    expires_at=expires_at,
                    tool_call_id=tool_call_id,
                    filename=filename,
                    conversation_ids=conversations,
                    last_accessed_at=now,
                )
                data_path = self._path(artifact_id, _DATA_SUFFIX)
                # rename replaces a planted symlink itself, never its target
                os.replace(tmp, data_path)
                tmp = None
                os.utime(data_path, (now, now), follow_symlinks=False)
                self._write_atomic(self._path(artifact_id, _META_SUFFIX), meta.sidecar())
                self._index[artifact_id] = meta
                _remember_data_file(artifact_id, data_path)
                self._total += meta.size_bytes - (old.size_bytes if old else 0)
                if self._total > self._max_total:
                    self._cleanup_by_size(keep=artifact_id)
        except OSError as exc:
            raise ArtifactError(f"could not store {artifact_id} ({exc.strerror})") from None
        finally:
            if tmp is not None:
                _unlink_quietly(tmp)
        logger.debug("stored %s (%d bytes)", artifact_id, meta.size_bytes)
        return meta.info()

    def retrieve(self, artifact_id: str) -> bytes:
        """The artifact's bytes, checked against its sha256; marks it accessed."""
        meta = self._live_meta(validate_artifact_id(artifact_id))
        path = self._path(artifact_id, _DATA_SUFFIX)
        try:
            payload = _read_regular_file(path, self._root, limit=meta.size_bytes)
        except FileNotFoundError:
            self._forget(artifact_id)
            raise ArtifactNotFound(f"artifact {artifact_id} not found") from None
        except _UnsafeFile:
            raise ArtifactError(f"artifact {artifact_id} is not a regular file inside the store; refused") from None
        except OSError as exc:
            raise ArtifactError(f"could not read {artifact_id} ({exc.strerror})") from None
        if len(payload) != meta.size_bytes or hashlib.sha256(payload).hexdigest() != meta.sha256:
            raise ArtifactError(f"artifact {artifact_id} is corrupt (size or sha256 differs); refused")
        self._touch(meta, path)
        return payload

    def retrieve_json(self, artifact_id: str) -> Any:
        """The artifact decoded as JSON (ArtifactError if it is not JSON)."""
        payload = self.retrieve(artifact_id)
        try:
            return json.loads(payload)
        except (ValueError, RecursionError):
            raise ArtifactError(f"artifact {artifact_id} is not JSON") from None

    def info(self, artifact_id: str) -> ArtifactInfo:
        """Metadata without counting as an access."""
        return self._live_meta(validate_artifact_id(artifact_id)).info()

    def exists(self, artifact_id: str) -> bool:
        try:
            self._live_meta(validate_artifact_id(artifact_id))
        except ArtifactNotFound:
            return False
        return True

    def delete(self, artifact_id: str) -> bool:
        """Remove the artifact; True if it existed."""
        validate_artifact_id(artifact_id)
        with self._lock:
            return self._remove(artifact_id)

    def list(self) -> builtins.list[ArtifactInfo]:
        """Live (unexpired) artifacts, oldest first (those another store on the same
        folder wrote included)."""
        now = self._clock()
        with self._lock:
            self._refresh()
            metas = [m for m in self._index.values() if m.expires_at is None or m.expires_at > now]
        return [m.info() for m in sorted(metas, key=lambda m: (m.created_at, m.artifact_id))]

    def cleanup_expired(self) -> int:
        """Remove every artifact past its expiry; returns how many."""
        now = self._clock()
        with self._lock:
            self._refresh()
            expired = [a for a, m in self._index.items() if m.expires_at is not None and m.expires_at <= now]
            removed = sum(1 for a in expired if self._remove(a))
        if removed:
            logger.info("removed %d expired artifacts", removed)
        return removed

    def cleanup_older_than(self, max_age_seconds: float) -> int:
        """Remove every artifact created more than ``max_age_seconds`` ago (whatever
        its TTL); returns how many."""
        require(
            isinstance(max_age_seconds, (int, float)) and not isinstance(max_age_seconds, bool) and max_age_seconds >= 0,
            "max_age_seconds",
            "must be a number of seconds, at least 0",
        )
        cutoff = self._clock() - max_age_seconds
        with self._lock:
            self._refresh()
            old = [a for a, m in self._index.items() if m.created_at < cutoff]
            return sum(1 for a in old if self._remove(a))

    def cleanup_by_size(self) -> int:
        """If over max_total_bytes, remove the least recently accessed artifacts
        until the total is at most the low-water mark; returns how many."""
        with self._lock:
            self._refresh()
            return self._cleanup_by_size(keep=None)

    def cleanup_conversation(self, conversation_id: str) -> int:
        """The conversation ended (v2.1 "会话结束清理"): remove the artifacts it stored
        that no other conversation still holds; returns how many were removed."""
        require(isinstance(conversation_id, str) and conversation_id, "conversation_id", "must be a non-empty string")
        removed = 0
        with self._lock:
            self._refresh(reread=True)  # another store may have tied artifacts to it
            for meta in builtins.list(self._index.values()):
                if conversation_id not in meta.conversation_ids:
                    continue
                meta.conversation_ids = [c for c in meta.conversation_ids if c != conversation_id]
                if not meta.conversation_ids:
                    removed += self._remove(meta.artifact_id)
                    continue
                try:
                    self._write_atomic(self._path(meta.artifact_id, _META_SUFFIX), meta.sidecar())
                except (OSError, ArtifactError) as exc:
                    logger.warning("could not update %s (%s)", meta.artifact_id, type(exc).__name__)
        if removed:
            logger.info("removed %d artifacts of an ended conversation", removed)
        return removed

    end_conversation = cleanup_conversation

    def start_cleaner(self, interval_seconds: float = DEFAULT_CLEAN_INTERVAL_SECONDS) -> None:
        """Run both cleanups now and every ``interval_seconds`` on the process's
        cleaner thread (a daemon). Calling it while running does nothing. The store
        starts it by itself at its first ``store`` unless ``auto_clean=False``."""
        _check_interval(interval_seconds, "interval_seconds")
        with self._lock:
            self._cleaner_stopped = False
            if self._cleaner_explicit and self._cleaner_enrolled and _CLEANER.running(self):
                return
            self._cleaner_enrolled = self._cleaner_explicit = True
        _CLEANER.enrol(self, float(interval_seconds), run_now=True)

    def stop_cleaner(self, timeout: float = 5.0) -> None:
        """Take this store off the cleaner thread (which ends when no store is left
        on it, within ``timeout`` seconds); doing it twice is harmless."""
        with self._lock:
            self._cleaner_enrolled = self._cleaner_explicit = False
            self._cleaner_stopped = True
        _CLEANER.withdraw(self, timeout)

    close = stop_cleaner

    @property
    def cleaner_running(self) -> bool:
        return self._cleaner_enrolled and _CLEANER.running(self)

    def __enter__(self) -> "ArtifactStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_cleaner()

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"<ArtifactStore artifacts={len(self._index)} total_bytes={self._total}>"

    # --- internals ----------------------------------------------------------------

    def _clean_once(self) -> None:
        try:
            self.cleanup_expired()
            self.cleanup_by_size()
        except Exception as exc:  # the cleaner must outlive a bad pass
            logger.error("artifact cleanup failed (%s)", type(exc).__name__)


    def _path(self, artifact_id: str, suffix: str) -> Path:
        return self._root / f"{artifact_id}{suffix}"

    def _live_meta(self, artifact_id: str) -> _Meta:
        with self._lock:
            meta = self._index.get(artifact_id) or self._load_one(artifact_id)
            if meta is not None and not os.path.exists(self._path(artifact_id, _META_SUFFIX)):
                self._total -= self._index.pop(artifact_id).size_bytes  # another store removed it
                meta = None
            if meta is not None and meta.expires_at is not None and meta.expires_at <= self._clock():
                self._remove(artifact_id)
                meta = None
        if meta is None:
            raise ArtifactNotFound(f"artifact {artifact_id} not found")
        return meta

    def _touch(self, meta: _Meta, path: Path) -> None:
        now = self._clock()
        with self._lock:
            if self._index.get(meta.artifact_id) is not meta:
                return  # deleted or replaced meanwhile
            meta.last_accessed_at = now
            try:
                os.utime(path, (now, now), follow_symlinks=False)
            except (OSError, NotImplementedError):
                pass  # access order stays right in memory; only a restart loses it

    def _forget(self, artifact_id: str) -> None:
        with self._lock:
            self._remove(artifact_id)

    def _remove(self, artifact_id: str) -> bool:  # lock held
        meta = self._index.pop(artifact_id, None)
        for suffix in (_DATA_SUFFIX, _META_SUFFIX):
            _unlink_quietly(self._path(artifact_id, suffix))
        if meta is None:
            return False
        self._total -= meta.size_bytes
        return True

    def _cleanup_by_size(self, keep: Optional[str]) -> int:  # lock held
        if self._total <= self._max_total:
            return 0
        victims = lru_victims(
            ((m.artifact_id, m.size_bytes, (m.last_accessed_at, m.created_at)) for m in self._index.values()),
            self._total,
            self._low_water,
            keep=keep,
        )
        removed = sum(1 for artifact_id in victims if self._remove(artifact_id))
        if removed:
            logger.info("removed %d least recently accessed artifacts to fit the size limit", removed)
        return removed

    def _write_temp(self, payload: bytes) -> Path:
        tmp = self._root / f"{_TMP_PREFIX}{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_BINARY, 0o600)
            try:
                view = memoryview(payload)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            finally:
                os.close(fd)
        except OSError as exc:
            _unlink_quietly(tmp)
            raise ArtifactError(f"could not write an artifact ({exc.strerror})") from None
        return tmp

    def _write_atomic(self, path: Path, payload: bytes) -> None:
        tmp = self._write_temp(payload)
        try:
            os.replace(tmp, path)
        except OSError:
            _unlink_quietly(tmp)
            raise

    @staticmethod
    def _checked_content_type(content_type: str) -> str:
        if not isinstance(content_type, str) or not _CONTENT_TYPE.match(content_type):
            raise ArtifactError("content_type must be 1-200 printable ASCII characters")
        return content_type

    @staticmethod
    def _filename_hint(filename: Optional[str], artifact_id: str, content_type: str) -> str:
        if filename is not None:
            if not isinstance(filename, str):
                raise ArtifactError("filename must be a string")
            name = PurePath(filename.replace("\\", "/")).name  # a hint, never a path
            name = _FILENAME_UNSAFE.sub("_", name).strip("._")[:100]
            if name:
                return name
        ext = _EXTENSIONS.get(content_type.split(";", 1)[0].strip().lower(), "bin")
        return f"{artifact_id}.{ext}"

    def _load(self) -> None:
        """Rebuild the index from the sidecars (after a restart)."""
        self._refresh(drop_temps=True)

    def _refresh(self, *, reread: bool = False, drop_temps: bool = False) -> None:
        """Bring the index in line with the folder, which other stores (this
        process or another) may share: add artifacts they wrote, forget those they
        removed; ``reread`` also re-reads known sidecars. Lock held (or construction)."""
        try:
            names = os.listdir(self._root)
        except OSError as exc:
            raise ArtifactError(f"cannot list the artifact root ({exc.strerror})") from None
        on_disk = set()
        for name in names:
            if name.startswith(_TMP_PREFIX):
                if drop_temps:
                    self._drop_stale_temp(name)
                continue
            if not name.endswith(_META_SUFFIX):
                continue
            artifact_id = name[: -len(_META_SUFFIX)]
            if not _ARTIFACT_ID.fullmatch(artifact_id):
                continue
            on_disk.add(artifact_id)
            if reread or artifact_id not in self._index:
                self._load_one(artifact_id)
        for artifact_id in [a for a in self._index if a not in on_disk]:
            self._total -= self._index.pop(artifact_id).size_bytes

    def _load_one(self, artifact_id: str) -> Optional[_Meta]:
        """Read one artifact's sidecar into the index (None if absent or unusable)."""
        try:
            raw = _read_regular_file(self._path(artifact_id, _META_SUFFIX), self._root, limit=_MAX_SIDECAR_BYTES)
            meta = _Meta.from_sidecar(raw, artifact_id)
            st = os.lstat(self._path(artifact_id, _DATA_SUFFIX))
            if not stat.S_ISREG(st.st_mode):
                raise _UnsafeFile()
            if st.st_size != meta.size_bytes:
                raise ValueError("data size differs from the sidecar")
            meta.last_accessed_at = st.st_mtime
        except FileNotFoundError:
            return None
        except (_UnsafeFile, OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            logger.warning("skipping artifact %s: unreadable or inconsistent metadata (%s)", artifact_id, type(exc).__name__)
            return None
        old = self._index.get(artifact_id)
        self._index[artifact_id] = meta
        self._total += meta.size_bytes - (old.size_bytes if old else 0)
        return meta

    def _drop_stale_temp(self, name: str) -> None:
        """Temp files of a crashed write; young ones may belong to a live writer."""
        path = self._root / name
        try:
            st = os.lstat(path)
            if time.time() - st.st_mtime > _STALE_TMP_SECONDS:  # file times are real time
                os.unlink(path)
        except OSError:
            pass


class _UnsafeFile(Exception):
    """A store file is a symlink, not a regular file, or resolves outside the root."""


def _read_regular_file(path: Path, root: Path, *, limit: int) -> bytes:
    """Read ``path`` refusing symlinks (O_NOFOLLOW + lstat), non-regular files and
    anything resolving outside ``root``; at most ``limit`` + 1 bytes."""
    if os.path.islink(path) or not path.resolve().is_relative_to(root):
        raise _UnsafeFile()
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_BINARY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _UnsafeFile() from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _UnsafeFile()
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove a store file (%s)", exc.strerror)


_DATA_FILES: "OrderedDict[str, str]" = OrderedDict()  # artifact id -> its file, most recent last
_DATA_FILES_MAX = 10_000


def _remember_data_file(artifact_id: str, path: Path) -> None:
    with _OPEN_LOCK:
        _DATA_FILES[artifact_id] = str(path)
        _DATA_FILES.move_to_end(artifact_id)
        if len(_DATA_FILES) > _DATA_FILES_MAX:
            _DATA_FILES.popitem(last=False)


def artifact_data_file(artifact_id: str) -> Optional[str]:
    """The real file an artifact was last stored to in this process (for
    ToolExecutionResult's private ``_data_file`` only: never shown to the model,
    in a log or in a message), or None."""
    return _DATA_FILES.get(artifact_id)


def lru_victims(
    entries: Any, total: int, low_water: int, *, keep: Optional[str] = None
) -> builtins.list[str]:
    """Which entries ``(key, size, last access)`` to remove, least recently
    accessed first, to bring ``total`` down to ``low_water``: it stops as soon as
    the total is there (the seeds' loop never stopped early). ``keep`` is spared."""
    victims = []
    for key, size, _ in sorted(entries, key=lambda e: e[2]):
        if total <= low_water:
            break
        if key == keep:
            continue
        victims.append(key)
        total -= size
    return victims


def _check_interval(value: Any, field: str) -> None:
    require(
        isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf,
        field,
        "must be a positive number",
    )


class _Cleaner:
    """One daemon thread that runs every enrolled store's cleanups at its interval.

    Stores are held weakly: a store nobody uses any more is dropped, and the thread
    ends when no store is left (it looks at least every ``_POLL`` seconds), so
    stores never leak threads, however many a process (or a test run) opens."""

    _POLL = 5.0

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._due: dict[int, builtins.list[Any]] = {}  # id -> [weakref, interval, next run]
        self._thread: Optional[threading.Thread] = None

    def enrol(self, store: "ArtifactStore", interval: float, run_now: bool) -> None:
        with self._cond:
            first = time.monotonic() + (0.0 if run_now else interval)
            self._due[id(store)] = [weakref.ref(store), interval, first]
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ArtifactStore-cleaner", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def withdraw(self, store: "ArtifactStore", timeout: float) -> None:
        with self._cond:
            entry = self._due.get(id(store))
            if entry is not None and entry[0]() is store:
                del self._due[id(store)]
            thread = self._thread if not self._due else None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def running(self, store: "ArtifactStore") -> bool:
        with self._cond:
            entry = self._due.get(id(store))
            alive = self._thread is not None and self._thread.is_alive()
            return alive and entry is not None and entry[0]() is store

    def _run(self) -> None:
        while True:
            with self._cond:
                for key in [k for k, e in self._due.items() if e[0]() is None]:
                    del self._due[key]
                if not self._due:
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                now = time.monotonic()
                ready = [e for e in self._due.values() if e[2] <= now]
                if not ready:
                    wait = min(e[2] for e in self._due.values()) - now
                    self._cond.wait(min(wait, self._POLL))
                    continue
                for entry in ready:
                    entry[2] = now + entry[1]
                refs = [e[0] for e in ready]
            _clean(refs)  # in a function: no strong reference outlives the pass
            del refs


def _clean(refs: builtins.list[Any]) -> None:
    for ref in refs:
        store = ref()
        if store is not None:
            store._clean_once()


_CLEANER = _Cleaner()

_OPEN_STORES: dict[Path, ArtifactStore] = {}
_OPEN_LOCK = threading.Lock()


def open_store(root: Union[str, os.PathLike[str]]) -> ArtifactStore:
    """The process's ArtifactStore on ``root`` (created on first use, then shared):
    what a ``storage_dir`` path resolves to. Raises ArtifactError when the
    directory cannot be created or written."""
    text = os.fspath(root)
    if not isinstance(text, str) or not text.strip():
        raise ArtifactError("storage_dir must be a non-empty directory path")
    if "\x00" in text:
        raise ArtifactError("storage_dir contains a NUL byte")
    key = Path(text).resolve()
    with _OPEN_LOCK:
        store = _OPEN_STORES.get(key)
        if store is None:
            store = _OPEN_STORES[key] = ArtifactStore(key)
        return store


def stores_holding(artifact_id: str) -> builtins.list[ArtifactStore]:
    """The process's open stores (``open_store``) that hold ``artifact_id``."""
    with _OPEN_LOCK:
        stores = builtins.list(_OPEN_STORES.values())
    found = []
    for store in stores:
        try:
            if store.exists(artifact_id):
                found.append(store)
        except ArtifactError:
            continue
    return found


def resolve_storage(value: Any) -> Any:
    """What a ``storage_dir`` / ``storage`` argument names: None, the store on a
    directory path (str or PathLike), or a store object (anything with ``store()``).
    Anything else is a TypeError, never a silently ignored store."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return open_store(value)
    if callable(getattr(value, "store", None)):
        return value
    raise TypeError(f"storage_dir must be a directory path or an ArtifactStore, not {type(value).__name__}")
