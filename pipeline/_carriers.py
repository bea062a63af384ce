"""The Claude-Code message carrier: content blocks and standard messages.

Research and debugging only (seeds v2.1): the production carrier is LangChain's
ToolMessage (``ToolExecutionResult.to_tool_message``). These models read and write
the ``{"role", "content": [blocks]}`` shape so a conversation can be inspected or
replayed, and refuse junk with a clear ValidationError.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ._models import ToolExecutionResult, ToolInvocationRequest


class MessageType(str, Enum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


class ContentBlockType(str, Enum):
    TEXT = "text"
    THINKING = "thinking"
    TOOL_USE = "tool_use"
    TOOL_RESULT = "tool_result"


# The field a block of each type cannot do without.
_REQUIRED: dict[ContentBlockType, tuple[str, ...]] = {
    ContentBlockType.TEXT: ("text",),
    ContentBlockType.THINKING: ("thinking",),
    ContentBlockType.TOOL_USE: ("id", "name"),
    ContentBlockType.TOOL_RESULT: ("tool_use_id",),
}


class ContentBlock(BaseModel):
    """One block of a message: text, thinking, a tool use or a tool result."""

    model_config = ConfigDict(extra="forbid")

    type: ContentBlockType
    content: Optional[str] = None  # tool_result content
    text: Optional[str] = None
    thinking: Optional[str] = None
    id: Optional[str] = Field(default=None, min_length=1, max_length=256)  # tool_use id
    name: Optional[str] = Field(default=None, min_length=1, max_length=200)  # tool name
    input: Optional[dict[str, Any]] = None  # tool arguments
    tool_use_id: Optional[str] = Field(default=None, min_length=1, max_length=256)
    is_error: bool = False

    @model_validator(mode="after")
    def _has_what_its_type_needs(self) -> "ContentBlock":
        missing = [name for name in _REQUIRED[self.type] if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.type.value} block needs {', '.join(missing)}")
        return self

    @classmethod
    def from_tool_result(cls, result: ToolExecutionResult) -> "ContentBlock":
        """The ``tool_result`` block of a result; failures carry the standard error
        observation and ``is_error``."""
        return cls(
            type=ContentBlockType.TOOL_RESULT,
            tool_use_id=result.tool_call_id,
            content=result.format_error_observation(),
            is_error=not result.success,
        )

    @classmethod
    def from_tool_request(cls, request: ToolInvocationRequest) -> "ContentBlock":
        """The ``tool_use`` block the model emitted for a request."""
        return cls(
            type=ContentBlockType.TOOL_USE,
            id=request.tool_call_id,
            name=request.tool_name,
            input=dict(request.parameters),
        )


class StandardMessage(BaseModel):
    """A Claude-Code-compatible message: a role and its content blocks."""

    model_config = ConfigDict(extra="forbid")

    role: MessageType
    content: list[ContentBlock] = Field(max_length=1_000)

    def to_debug_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (not a LangChain message); unset fields left out."""
        return {
            "role": self.role.value,
            "content": [
                block.model_dump(mode="json", exclude_none=True) for block in self.content
            ],
        }

    @classmethod
    def from_dict(cls, data: Any) -> "StandardMessage":
        """Read a debug dict back; a plain string content reads as one text block,
        as the Messages API allows. Raises pydantic's ValidationError on junk."""
        if isinstance(data, dict) and isinstance(data.get("content"), str):
            data = {**data, "content": [{"type": "text", "text": data["content"]}]}
        return cls.model_validate(data)

    @classmethod
    def from_tool_result(cls, result: ToolExecutionResult) -> "StandardMessage":
        """The user message that carries a tool result back to the model."""
        return cls(role=MessageType.USER, content=[ContentBlock.from_tool_result(result)])
