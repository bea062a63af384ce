"""Tool error types with their retry classification, the standard error response,
and the mapping from a Python exception raised by a tool to an error type.

A tool failure is data for the agent, not an exception: the executor turns it into
an error result the model reads. Classification decides whether the executor
retries (transient), gives up at once (permanent) or reports a failure that needs
a human (execution errors).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional, Union

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic import ValidationError as _PydanticValidationError

from ._exceptions import ArtifactNotFound, PipelineError
from ._models import ToolExecutionResult


class ToolErrorType(str, Enum):
    """Standardised error types (the seeds' eleven)."""

    # Transient: worth retrying.
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    RESOURCE_ERROR = "resource_error"
    TRANSIENT_ERROR = "transient_error"
    # Permanent: retrying cannot help.
    PERMISSION_DENIED = "permission_denied"
    INVALID_PARAMETERS = "invalid_parameters"
    NOT_FOUND = "not_found"
    VALIDATION_ERROR = "validation_error"
    # Execution errors: need a human to look.
    EXECUTION_ERROR = "execution_error"
    INTERNAL_ERROR = "internal_error"
    DEPENDENCY_ERROR = "dependency_error"

    @property
    def is_retryable(self) -> bool:
        return self in _RETRYABLE

    @property
    def is_permanent(self) -> bool:
        return self in _PERMANENT

    @property
    def default_code(self) -> str:
        """The error code when a tool gives none: the type in capitals."""
        return self.value.upper()


_RETRYABLE = frozenset(
    {
        ToolErrorType.TIMEOUT,
        ToolErrorType.RATE_LIMIT,
        ToolErrorType.RESOURCE_ERROR,
        ToolErrorType.TRANSIENT_ERROR,
    }
)
_PERMANENT = frozenset(
    {
        ToolErrorType.PERMISSION_DENIED,
        ToolErrorType.INVALID_PARAMETERS,
        ToolErrorType.NOT_FOUND,
        ToolErrorType.VALIDATION_ERROR,
    }
)

_MESSAGE_LIMIT = 2_000  # an error message is for the model: bounded


class ToolError(PipelineError):
    """Raised by a tool to say exactly what went wrong (type, message, code).

    ``raise ToolError(ToolErrorType.RATE_LIMIT, "quota exceeded", code="HTTP_429")``
    becomes a RATE_LIMIT error result (and is retried per the retry policy).
    """

    def __init__(
        self,
        error_type: Union[ToolErrorType, str],
        message: str,
        code: Optional[str] = None,
    ) -> None:
        self.error_type = ToolErrorType(error_type)
        self.message = str(message)
        self.code = code or self.error_type.default_code
        super().__init__(self.message)


def classify_exception(exc: BaseException) -> ToolErrorType:
    """The error type of an exception a tool raised.

    Order matters: the more specific classes come first (a PermissionError and a
    TimeoutError are both OSErrors; ArtifactNotFound is a KeyError).
    """
    if isinstance(exc, ToolError):
        return exc.error_type
    if isinstance(exc, TimeoutError):  # includes ToolTimeoutError and socket.timeout
        return ToolErrorType.TIMEOUT
    if isinstance(exc, PermissionError):
        return ToolErrorType.PERMISSION_DENIED
    if isinstance(exc, (FileNotFoundError, ArtifactNotFound, KeyError)):
        return ToolErrorType.NOT_FOUND
    if isinstance(exc, ConnectionError):
        return ToolErrorType.TRANSIENT_ERROR
    if isinstance(exc, MemoryError):
        return ToolErrorType.RESOURCE_ERROR
    if isinstance(exc, (_PydanticValidationError, ValueError, TypeError)):
        return ToolErrorType.INVALID_PARAMETERS
    return ToolErrorType.EXECUTION_ERROR


def describe_exception(exc: BaseException) -> str:
    """A one-line message for the model: the exception's text, or its class name."""
    if isinstance(exc, ToolError):
        text = exc.message
    else:
        try:
            text = str(exc)
        except Exception:
            text = ""
        if isinstance(exc, KeyError) and not isinstance(exc, ArtifactNotFound) and exc.args:
            text = f"missing key {exc.args[0]!r}"
    text = text or type(exc).__name__
    return text if len(text) <= _MESSAGE_LIMIT else text[:_MESSAGE_LIMIT] + "... [truncated]"


class ToolErrorResponse(BaseModel):
    """A tool failure in the standard shape, before it becomes a result."""

    model_config = ConfigDict(extra="forbid")

    # ``request_id`` is the seeds' v2.0 name (v2.1 calls it tool_call_id); both are taken.
    tool_call_id: str = Field(
        min_length=1, max_length=256, validation_alias=AliasChoices("tool_call_id", "request_id")
    )
    error_type: ToolErrorType
    error_code: str = Field(min_length=1, max_length=200)
    error_message: str

    @classmethod
    def from_exception(cls, tool_call_id: str, exc: BaseException) -> "ToolErrorResponse":
        error_type = classify_exception(exc)
        code = exc.code if isinstance(exc, ToolError) else error_type.default_code
        return cls(
            tool_call_id=tool_call_id,
            error_type=error_type,
            error_code=code[:200],
            error_message=describe_exception(exc),
        )

    @property
    def request_id(self) -> str:
        """The seeds' v2.0 name of ``tool_call_id``."""
        return self.tool_call_id

    @property
    def should_retry(self) -> bool:
        return self.error_type.is_retryable

    def to_result(self, **fields: Any) -> ToolExecutionResult:
        """The error result; its observation is the standard error observation.

        Extra fields (retry_count, last_error, duration_ms, ...) pass through.
        """
        result = ToolExecutionResult(
            tool_call_id=self.tool_call_id,
            observation="",
            success=False,
            error_code=self.error_code,
            error_type=self.error_type.value,
            error_message=self.error_message,
            **fields,
        )
        result.observation = result.format_error_observation()
        return result
