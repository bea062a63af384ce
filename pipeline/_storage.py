"""The seeds' file-storage helpers, on top of the ArtifactStore:

- ``DataStorage`` (v2.1 "文件存储策略"): class methods over ``STORAGE_DIR`` that store
  large data under an artifact id, read it back and clean old files.
- ``DataFileManager`` (v2.0 "File Cleanup Strategy"): tracks files tools wrote into
  ``STORAGE_DIR`` (metadata in ``METADATA_FILE``) and removes them by age, by total
  size (least recently accessed first) and when their conversation ends, on the
  process's cleaner thread.

The cleanup rules (TTL, LRU to a low-water mark that really stops early) are the
store's own (``lru_victims``), not a second copy.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, ClassVar, Optional, Union

from . import _artifacts
from ._artifacts import ArtifactStore, lru_victims, open_store
from ._config import require
from ._exceptions import ArtifactError
from ._models import Payload

logger = logging.getLogger("pipeline.storage")


class DataStorage:
    """Large tool data by artifact id (v2.1): the model sees the id, never a path.

    ``STORAGE_DIR`` (default ``tool_data`` in the working directory) may be set on
    the class; each directory gets the process's one ArtifactStore on it."""

    STORAGE_DIR: ClassVar[Path] = Path("tool_data")

    @classmethod
    def _store(cls) -> ArtifactStore:
        return open_store(cls.STORAGE_DIR)

    @classmethod
    def store_large_data(cls, tool_call_id: str, data: Any, data_hash: Optional[str] = None) -> str:
        """Store ``data`` (text as UTF-8, bytes as is, anything else as JSON) and
        return its artifact id. The id is the content's full sha256, so the
        seeds' ``data_hash`` is accepted but not needed."""
        payload = Payload.of(data)
        info = cls._store().store(payload.body, content_type=payload.content_type, tool_call_id=tool_call_id)
        return info.artifact_id

    @classmethod
    def retrieve_data(cls, artifact_id: str) -> Any:
        """The data stored under ``artifact_id``: JSON decoded, text as str, other
        bytes as bytes. Raises InvalidArtifactId for anything but an artifact id
        (a path is refused) and ArtifactNotFound when it is gone."""
        store = cls._store()
        body = store.retrieve(artifact_id)
        content_type = store.info(artifact_id).content_type
        if content_type.startswith("application/json"):
            return json.loads(body)
        if content_type.startswith("text/"):
            return body.decode("utf-8", "surrogatepass")
        return body

    @classmethod
    def cleanup_old_files(cls, max_age_hours: float = 24) -> int:
        """Remove what was stored more than ``max_age_hours`` ago; returns how many."""
        require(
            isinstance(max_age_hours, (int, float)) and not isinstance(max_age_hours, bool) and max_age_hours >= 0,
            "max_age_hours",
            "must be a number of hours, at least 0",
        )
        return cls._store().cleanup_older_than(max_age_hours * 3600.0)


class DataFileManager:
    """Files tools wrote into ``STORAGE_DIR``, removed by age, size and conversation
    (v2.0 "File Cleanup Strategy", v2.1 "会话结束清理").

    Only files inside ``STORAGE_DIR`` can be registered (the sandbox); the metadata
    survives a restart (``METADATA_FILE``, written atomically) and the cleanups run
    on the process's cleaner thread, started by ``auto_start``."""

    STORAGE_DIR: ClassVar[Path] = Path("tool_data")
    METADATA_FILE: ClassVar[Path] = STORAGE_DIR / ".metadata.json"

    def __init__(
        self,
        max_age_hours: float = 24,
        max_size_gb: float = 10,
        cleanup_interval_seconds: float = 3600,
        auto_start: bool = True,
    ) -> None:
        for name, value in (("max_age_hours", max_age_hours), ("max_size_gb", max_size_gb),
                            ("cleanup_interval_seconds", cleanup_interval_seconds)):
            require(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, name, "must be positive")
        self.max_age_seconds = float(max_age_hours) * 3600.0
        self.max_size_bytes = int(max_size_gb * 1024**3)
        self.cleanup_interval = float(cleanup_interval_seconds)
        self._root = Path(self.STORAGE_DIR).resolve()
        self._metadata_file = Path(self.METADATA_FILE)
        self._lock = threading.RLock()
        self._metadata: dict[str, dict[str, Any]] = {}
        self._running = False
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactError(f"cannot create the storage directory ({exc.strerror})") from None
        self._load_metadata()  # the seeds never loaded it: every restart forgot every file
        if auto_start:
            self.start_cleanup_daemon()

    # --- the cleaner thread ---------------------------------------------------------

    def start_cleanup_daemon(self) -> None:
        """Clean now and every ``cleanup_interval`` seconds on the cleaner thread."""
        with self._lock:
            if self._running and _artifacts._CLEANER.running(self):
                logger.warning("Cleanup daemon already running")
                return
            self._running = True
        _artifacts._CLEANER.enrol(self, self.cleanup_interval, run_now=True)

    def stop_cleanup_daemon(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._running = False
        _artifacts._CLEANER.withdraw(self, timeout)

    def __enter__(self) -> "DataFileManager":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_cleanup_daemon()

    def _clean_once(self) -> None:
        try:
            self.cleanup_expired()
            self.cleanup_by_size()
        except Exception as exc:
            logger.error("Cleanup task error: %s", type(exc).__name__)

    # --- files ------------------------------------------------------------------------

    def register_file(self, file_path: Union[str, os.PathLike[str]], metadata: dict[str, Any]) -> None:
        """Track a file the tool wrote; ``metadata`` may give size_bytes,
        tool_call_id and conversation_id. A path outside STORAGE_DIR is refused."""
        key = self._key(file_path)
        size = metadata.get("size_bytes")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            try:
                size = os.stat(key).st_size
            except OSError:
                size = 0
        now = time.time()
        with self._lock:
            self._metadata[key] = {
                "created_at": now,
                "accessed_at": now,
                "size_bytes": size,
                "tool_call_id": metadata.get("tool_call_id"),
                "conversation_id": metadata.get("conversation_id"),
            }
            self._save_metadata()

    def touch_file(self, file_path: Union[str, os.PathLike[str]]) -> None:
        """Mark a file used now (for the least-recently-used order)."""
        key = self._key(file_path)
        with self._lock:
            if key in self._metadata:
                self._metadata[key]["accessed_at"] = time.time()
                self._save_metadata()

    def cleanup_expired(self) -> int:
        """Remove files registered more than ``max_age_hours`` ago; returns how many."""
        cutoff = time.time() - self.max_age_seconds
        with self._lock:
            return self._remove([k for k, m in self._metadata.items() if m["created_at"] < cutoff])

    def cleanup_by_size(self) -> int:
        """Over ``max_size_gb``: remove the least recently accessed files until the
        total is at most 80 % of it; returns how many."""
        with self._lock:
            total = sum(m["size_bytes"] for m in self._metadata.values())
            if total <= self.max_size_bytes:
                return 0
            entries = ((k, m["size_bytes"], m["accessed_at"]) for k, m in self._metadata.items())
            return self._remove(lru_victims(entries, total, int(self.max_size_bytes * 0.8)))

    def cleanup_conversation(self, conversation_id: str) -> int:
        """The conversation ended: remove the files registered for it."""
        with self._lock:
            return self._remove([k for k, m in self._metadata.items() if m.get("conversation_id") == conversation_id])

    # --- internals --------------------------------------------------------------------

    def _key(self, file_path: Union[str, os.PathLike[str]]) -> str:
        path = Path(file_path)
        resolved = (path if path.is_absolute() else Path.cwd() / path).resolve()
        if not resolved.is_relative_to(self._root) or resolved == self._root:
            raise ArtifactError("only files inside the storage directory can be managed")
        return str(resolved)

    def _remove(self, keys: list[str]) -> int:  # lock held
        removed = 0
        for key in keys:
            try:
                os.unlink(key)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.error("Failed to delete a stored file: %s", exc.strerror)
                continue
            del self._metadata[key]
            removed += 1
        if removed:
            self._save_metadata()
            logger.info("Cleaned up %d stored files", removed)
        return removed

    def _save_metadata(self) -> None:  # lock held
        tmp = self._metadata_file.with_name(f".{self._metadata_file.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self._metadata, indent=2), encoding="utf-8")
            os.replace(tmp, self._metadata_file)
        except OSError as exc:
            logger.error("Failed to save metadata: %s", exc.strerror)

    def _load_metadata(self) -> None:
        try:
            data = json.loads(self._metadata_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            logger.error("Failed to load metadata: %s", type(exc).__name__)
            return
        if not isinstance(data, dict):
            return
        for key, meta in data.items():
            if (
                isinstance(key, str)
                and isinstance(meta, dict)
                and isinstance(meta.get("created_at"), (int, float))
                and isinstance(meta.get("accessed_at"), (int, float))
                and isinstance(meta.get("size_bytes"), int)
                and Path(key).resolve().is_relative_to(self._root)
            ):
                self._metadata[key] = meta
