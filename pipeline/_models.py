"""The tool protocol's request and result models (seeds v2.1)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from ._levels import OutputLevel


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
    timeout_ms: int = Field(default=120_000, gt=0)
    retry_on_timeout: bool = True
    caller_id: str = "agent"
    permission_level: str = "default"
    idempotency_key: Optional[str] = None
    cache_policy: ToolCachePolicy = ToolCachePolicy.NO_CACHE


class ToolExecutionResult(BaseModel):
    """The one result model of a tool execution (seeds v2.0.1+).

    ``artifact_id`` is the only handle to stored data: a real path never appears.
    """

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=256)
    observation: str
    output_level: OutputLevel = OutputLevel.STANDARD

    artifact_id: Optional[str] = Field(default=None, pattern=r"^artifact_[0-9a-f]{16,64}$")
    data_size_bytes: int = Field(default=0, ge=0)
    data_hash: Optional[str] = None
    data_summary: Optional[str] = None

    retry_count: int = Field(default=0, ge=0)
    last_error: Optional[str] = None

    success: bool
    error_code: Optional[str] = None
    error_type: Optional[str] = None
    error_message: Optional[str] = None

    duration_ms: float = Field(default=0.0, ge=0)
    # Engineering data beyond the seeds' fields: never shown to the model.
    observation_tokens: int = Field(default=0, ge=0)
    cache_hit: bool = False
