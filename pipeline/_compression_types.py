"""What a context compression did, message by message: the data the dashboard's
compression diff is drawn from."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from ._bounds import MAX_COST_USD, MAX_COUNT, MAX_DURATION_MS


class CompressionMode(str, Enum):
    TRUNCATE = "truncate"  # keep the newest messages that fit (fastest)
    EXTRACT = "extract"  # keep by priority
    SUMMARIZE = "summarize"  # replace older messages with a summary


class MessagePriority(str, Enum):
    CRITICAL = "critical"  # system messages: never dropped
    HIGH = "high"  # user messages, tool errors, AI tool calls
    MEDIUM = "medium"  # plain AI text, successful tool results
    LOW = "low"  # verbose logs: dropped first


class MessageAction(str, Enum):
    KEPT = "kept"
    DROPPED = "dropped"
    TRUNCATED = "truncated"
    SUMMARIZED = "summarized"


class MessageChange(BaseModel):
    """The fate of one original message."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, le=MAX_COUNT)  # position in the original list
    role: str = Field(max_length=32)
    priority: MessagePriority
    action: MessageAction
    tokens_before: int = Field(ge=0, le=MAX_COUNT)
    tokens_after: int = Field(ge=0, le=MAX_COUNT)  # 0 when dropped or summarised away
    new_index: Optional[int] = Field(default=None, ge=0, le=MAX_COUNT)  # position in the new list
    summary_id: Optional[str] = None  # set when action is SUMMARIZED
    tool_call_ids: list[str] = Field(default_factory=list)  # calls made or answered
    reason: str = ""  # why, in words a person reads on the diff page
    content_before: str = ""  # possibly cut for size; see content_cut
    content_after: Optional[str] = None  # set when TRUNCATED
    content_cut: bool = False


class CompressionSummary(BaseModel):
    """A message that replaced several originals."""

    model_config = ConfigDict(extra="forbid")

    summary_id: str
    text: str
    replaced_indices: list[Annotated[int, Field(ge=0, le=MAX_COUNT)]]
    tokens: int = Field(ge=0, le=MAX_COUNT)
    new_index: Optional[int] = Field(default=None, ge=0, le=MAX_COUNT)
    summarizer: str = "extractive"
    cached: bool = False
    estimated_cost_usd: float = Field(default=0.0, ge=0, le=MAX_COST_USD)


class CompressionResult(BaseModel):
    """Everything a compression did, enough to draw it as a diff."""

    model_config = ConfigDict(extra="forbid")

    mode: CompressionMode
    requested_mode: Optional[CompressionMode] = None  # differs from mode on a fallback
    fallback_reason: Optional[str] = None
    model: Optional[str] = None
    target_tokens: int = Field(ge=0, le=MAX_COUNT)
    tokens_before: int = Field(ge=0, le=MAX_COUNT)
    tokens_after: int = Field(ge=0, le=MAX_COUNT)
    messages_before: int = Field(ge=0, le=MAX_COUNT)
    messages_after: int = Field(ge=0, le=MAX_COUNT)
    target_met: bool
    only_protected_remain: bool = False  # target missed because only protected messages were left
    changes: list[MessageChange] = Field(default_factory=list)
    summaries: list[CompressionSummary] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)  # snapshot of the config in force
    duration_ms: float = Field(default=0.0, ge=0, le=MAX_DURATION_MS)

    def count(self, action: MessageAction) -> int:
        return sum(1 for change in self.changes if change.action is action)
