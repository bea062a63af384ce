"""The tool protocol's request and result models (seeds v2.1)."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._artifacts import ARTIFACT_ID_RE, THRESHOLD_BYTES, artifact_data_file
from ._bounds import MAX_BYTES, MAX_COUNT, MAX_DURATION_MS, MAX_RETRIES
from ._levels import (
    OutputLevel,
    _render,
    canonical_json,
    resolve_output_level,
    summarize_data,
    to_json,
)

if TYPE_CHECKING:  # pragma: no cover
    from langchain_core.messages import ToolMessage

logger = logging.getLogger("pipeline.tools")


class ToolCachePolicy(str, Enum):
    """Whether, and for how long, a tool's result may be reused for the same
    idempotency key. NO_CACHE is the safe default."""

    NO_CACHE = "no_cache"
    CACHEABLE = "cacheable"
    TTL_SHORT = "ttl_short"  # 5 minutes
    TTL_MEDIUM = "ttl_medium"  # 1 hour
    TTL_LONG = "ttl_long"  # 24 hours


class ToolInvocationRequest(BaseModel):
    """One call of a tool, as the model asked for it.

    ``tool_call_id`` comes from the model (``AIMessage.tool_calls[i]["id"]``) and is
    never generated here.
    """

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=256)
    tool_name: str = Field(min_length=1, max_length=200)
    tool_version: str = "1.0.0"
    parameters: dict[str, Any] = Field(default_factory=dict)
    output_level: Optional[OutputLevel] = None
    timeout_ms: int = Field(default=120_000, gt=0, le=MAX_COUNT)
    retry_on_timeout: bool = True
    caller_id: str = "agent"
    permission_level: str = "default"
    # Where large or FULL data goes (an artifact store on that directory); the
    # executor's own store when None.
    storage_dir: Optional[str] = Field(default=None, min_length=1, max_length=4096)
    idempotency_key: Optional[str] = None
    cache_policy: ToolCachePolicy = ToolCachePolicy.NO_CACHE

    @field_validator("storage_dir", mode="before")
    @classmethod
    def _path_as_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    def get_effective_output_level(
        self,
        tool_config_default: Optional[OutputLevel] = None,
        global_default: OutputLevel = OutputLevel.STANDARD,
        context_window_usage: float = 0.0,
    ) -> OutputLevel:
        """The level this call is rendered at (seeds v2.0): the request's own level >
        the tool's configured default > BRIEF when the context is over 80 % full >
        ``global_default``. The executor decides the same way."""
        return resolve_output_level(
            self.output_level, tool_config_default, context_window_usage, global_default
        )

    @classmethod
    def from_tool_call(cls, tool_call: Mapping[str, Any], **fields: Any) -> "ToolInvocationRequest":
        """A request from one LangChain tool call (``{"id", "name", "args"}``), so the
        id is the model's own. Other fields (caller_id, timeout_ms, ...) as keywords."""
        if not isinstance(tool_call, Mapping):
            raise TypeError("tool_call must be a mapping with id, name and args")
        return cls(
            tool_call_id=tool_call.get("id"),
            tool_name=tool_call.get("name"),
            parameters=tool_call.get("args") or {},
            **fields,
        )

    def get_or_generate_idempotency_key(self) -> str:
        """The key under which this call's result may be reused.

        An explicit ``idempotency_key`` wins. Otherwise the sha256 of a canonical JSON
        (sorted keys at every level) of tool name, version, parameters, caller and
        permission level. ``tool_call_id`` is left out on purpose: it differs every
        round, and the point of the key is to recognise the same call across rounds.
        """
        if self.idempotency_key:
            return self.idempotency_key
        canonical = canonical_json(
            {
                "tool_name": self.tool_name,
                "tool_version": self.tool_version,
                "parameters": self.parameters,
                "caller_id": self.caller_id,
                "permission_level": self.permission_level,
            }
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Payload:
    """Raw tool data encoded once: what is hashed, measured and stored as an artifact.

    Text stays text (utf-8), bytes stay bytes, everything else is its JSON form, so
    ``data_hash`` equals the artifact's sha256 and FULL never re-encodes.
    """

    raw: Any
    body: bytes
    content_type: str
    full_json: Optional[str]  # the FULL observation text for structured data

    @classmethod
    def of(cls, raw: Any) -> "Payload":
        if isinstance(raw, str):
            return cls(raw, raw.encode("utf-8", "surrogatepass"), "text/plain; charset=utf-8", None)
        if isinstance(raw, (bytes, bytearray)):
            return cls(raw, bytes(raw), "application/octet-stream", to_json(raw))
        text = to_json(raw)
        return cls(raw, text.encode("utf-8", "surrogatepass"), "application/json", text)

    @property
    def size_bytes(self) -> int:
        return len(self.body)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


class ToolExecutionResult(BaseModel):
    """The one result model of a tool execution (seeds v2.0.1+).

    ``artifact_id`` is the only handle to stored data: a real path never appears.
    """

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=256)
    observation: str
    output_level: OutputLevel = OutputLevel.STANDARD

    artifact_id: Optional[str] = Field(default=None, pattern=ARTIFACT_ID_RE)
    data_size_bytes: int = Field(default=0, ge=0, le=MAX_BYTES)
    data_hash: Optional[str] = None
    data_summary: Optional[str] = None

    retry_count: int = Field(default=0, ge=0, le=MAX_RETRIES)
    last_error: Optional[str] = None

    success: bool
    error_code: Optional[str] = None
    error_type: Optional[str] = None
    error_message: Optional[str] = None

    duration_ms: float = Field(default=0.0, ge=0, le=MAX_DURATION_MS)
    # Engineering data beyond the seeds' fields: never shown to the model.
    observation_tokens: int = Field(default=0, ge=0, le=MAX_COUNT)
    cache_hit: bool = False
    # What degraded without failing the call (artifact store or token counter down).
    warnings: list[str] = Field(default_factory=list, max_length=20)

    @property
    def _data_file(self) -> Optional[str]:
        """The seeds' private real path of the stored data: never serialised, never
        shown to the model (a property, so it costs a result nothing until read)."""
        return artifact_data_file(self.artifact_id) if self.artifact_id else None

    # ------------------------------------------------------------------ building

    @classmethod
    def from_raw_data(
        cls,
        tool_call_id: str,
        raw_data: Any,
        output_level: OutputLevel = OutputLevel.STANDARD,
        storage_dir: Any = None,
        *,
        storage: Any = None,
        force_artifact: bool = False,
        conversation_id: Optional[str] = None,
    ) -> "ToolExecutionResult":
        """A successful result with the observation rendered at ``output_level``.

        ``storage_dir`` (the seeds' name) is a directory path (str or Path: the
        process's ArtifactStore on it) or an ArtifactStore; ``storage=`` is the
        library's earlier keyword for the same. A path that cannot hold a store
        raises ArtifactError here, and anything else raises TypeError, instead of
        the data silently staying inline. With a store, data of THRESHOLD_BYTES or
        more, FULL level, or ``force_artifact`` goes to the store and the
        observation carries only the artifact id and a summary. ``conversation_id``
        ties the artifact to a conversation, for cleanup when it ends.

        A store that fails while writing (disk full, size limit) degrades to an
        inline observation and a warning, never a failed call; data of the
        threshold or more is then shown at STANDARD, never inline in full.
        """
        from ._artifacts import resolve_storage

        if storage is not None and storage_dir is not None:
            raise TypeError("give storage_dir or storage, not both")
        store = resolve_storage(storage_dir if storage is None else storage)
        return cls.from_payload(
            tool_call_id,
            Payload.of(raw_data),
            OutputLevel(output_level),
            store,
            force_artifact,
            conversation_id,
        )

    @classmethod
    def from_payload(
        cls,
        tool_call_id: str,
        payload: Payload,
        output_level: OutputLevel,
        storage: Any = None,
        force_artifact: bool = False,
        conversation_id: Optional[str] = None,
    ) -> "ToolExecutionResult":
        """from_raw_data for data already encoded (the executor encodes once) and a
        store already resolved."""
        artifact_id: Optional[str] = None
        summary: Optional[str] = None
        warnings: list[str] = []
        level = output_level
        large = payload.size_bytes >= THRESHOLD_BYTES
        if storage is not None and (force_artifact or output_level is OutputLevel.FULL or large):
            try:
                extra = {} if conversation_id is None else {"conversation_id": conversation_id}
                info = storage.store(
                    payload.body,
                    content_type=payload.content_type,
                    tool_call_id=tool_call_id,
                    **extra,
                )
                artifact_id = info.artifact_id
            except Exception as exc:  # the store is an edge: degrade, keep the data inline
                logger.warning("artifact store failed for %s: %s", tool_call_id, exc)
                warnings.append(f"artifact_store_failed: {type(exc).__name__}: {str(exc)[:200]}")
                if large and level is OutputLevel.FULL:
                    level = OutputLevel.STANDARD  # a preview, never megabytes inline
            summary = summarize_data(payload.raw)
        if artifact_id is not None:
            observation = _render(payload.raw, OutputLevel.FULL, artifact_id, summary, None)
        else:
            observation = _render(payload.raw, level, None, None, payload.full_json)
        return cls(
            tool_call_id=tool_call_id,
            observation=observation,
            output_level=output_level,
            artifact_id=artifact_id,
            data_size_bytes=payload.size_bytes,
            data_hash=payload.sha256,
            data_summary=summary,
            success=True,
            warnings=warnings,
        )

    def create_retry(self, new_timeout_ms: int) -> "ToolExecutionResult":
        """The seeds' (v2.0) record of a retry about to run after this failure:
        retry_count + 1, this error as ``last_error``, error_type "RETRY".
        ``new_timeout_ms`` is the retry's timeout (the executor grows it per
        ToolRetryPolicy.get_retry_timeout); it is not stored, as in the seeds."""
        return ToolExecutionResult(
            tool_call_id=self.tool_call_id,
            observation=f"Retry {self.retry_count + 1} after: {self.last_error or self.error_message}",
            output_level=self.output_level,
            retry_count=min(self.retry_count + 1, MAX_RETRIES),
            last_error=self.error_message,
            success=False,
            error_type="RETRY",
            error_message=f"Retrying after {self.retry_count + 1} failures",
        )

    # ------------------------------------------------------------------ carriers

    def format_error_observation(self) -> str:
        """The seeds' standard error observation (the observation itself on success),
        so the agent reads every tool failure in one shape."""
        if self.success:
            return self.observation
        return (
            "Operation failed.\n\n"
            f"Error Type: {self.error_type or 'Unknown'}\n"
            f"Error Code: {self.error_code or 'UNKNOWN'}\n"
            f"Error Message: {self.error_message or 'An unknown error occurred'}\n\n"
            f"Tool Call ID: {self.tool_call_id}"
        )

    def to_tool_message(self) -> "ToolMessage":
        """The LangChain ToolMessage carrier (the production path), with
        ``status="error"`` on failures."""
        try:
            from langchain_core.messages import ToolMessage
        except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
            raise ImportError(
                "to_tool_message() needs langchain-core: "
                "pip install pipeline-observatory[langchain]"
            ) from exc
        return ToolMessage(
            content=self.format_error_observation(),
            tool_call_id=self.tool_call_id,
            status="success" if self.success else "error",
        )

    def to_llm_message(self) -> dict[str, Any]:
        """The Claude-Code ``tool_result`` carrier (research and debugging)."""
        return {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": self.tool_call_id,
                    "content": self.format_error_observation(),
                    "is_error": not self.success,
                }
            ],
        }
