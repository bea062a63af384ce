"""The tool protocol's request and result models (seeds v2.1)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from ._artifacts import ARTIFACT_ID_RE
from ._bounds import MAX_BYTES, MAX_COUNT, MAX_DURATION_MS, MAX_RETRIES
from ._levels import OutputLevel, _render, canonical_json, summarize_data, to_json

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
    idempotency_key: Optional[str] = None
    cache_policy: ToolCachePolicy = ToolCachePolicy.NO_CACHE

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


def _artifact_threshold() -> int:
    from ._artifacts import THRESHOLD_BYTES  # the store's module owns the threshold

    return THRESHOLD_BYTES


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

    # ------------------------------------------------------------------ building

    @classmethod
    def from_raw_data(
        cls,
        tool_call_id: str,
        raw_data: Any,
        output_level: OutputLevel = OutputLevel.STANDARD,
        storage: Any = None,
        *,
        force_artifact: bool = False,
    ) -> "ToolExecutionResult":
        """A successful result with the observation rendered at ``output_level``.

        With a ``storage`` (an ArtifactStore), data of THRESHOLD_BYTES or more, FULL
        level, or ``force_artifact`` goes to the store and the observation carries
        only the artifact id and a summary. A failing store degrades to an inline
        observation and a warning; it never fails the call.
        """
        return cls.from_payload(
            tool_call_id, Payload.of(raw_data), OutputLevel(output_level), storage, force_artifact
        )

    @classmethod
    def from_payload(
        cls,
        tool_call_id: str,
        payload: Payload,
        output_level: OutputLevel,
        storage: Any = None,
        force_artifact: bool = False,
    ) -> "ToolExecutionResult":
        """from_raw_data for data already encoded (the executor encodes once)."""
        artifact_id: Optional[str] = None
        summary: Optional[str] = None
        warnings: list[str] = []
        if storage is not None and (
            force_artifact
            or output_level is OutputLevel.FULL
            or payload.size_bytes >= _artifact_threshold()
        ):
            try:
                info = storage.store(
                    payload.body, content_type=payload.content_type, tool_call_id=tool_call_id
                )
                artifact_id = info.artifact_id
            except Exception as exc:  # the store is an edge: degrade, keep the data inline
                logger.warning("artifact store failed for %s: %s", tool_call_id, exc)
                warnings.append(f"artifact_store_failed: {type(exc).__name__}: {str(exc)[:200]}")
            summary = summarize_data(payload.raw)
        if artifact_id is not None:
            observation = _render(payload.raw, OutputLevel.FULL, artifact_id, summary, None)
        else:
            observation = _render(payload.raw, output_level, None, None, payload.full_json)
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
