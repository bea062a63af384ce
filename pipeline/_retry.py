"""Retry policy for tool execution: which error types are retried, how often, with
what backoff, and how the timeout grows on each retry (seeds 001 Phase 1.5)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ._config import require
from ._errors import ToolErrorType


def _retryable_types() -> list[ToolErrorType]:
    return [t for t in ToolErrorType if t.is_retryable]


class ToolRetryPolicy(BaseModel):
    """How the executor retries a failed tool call.

    ``attempt`` counts retries from 0: the first retry waits ``initial_delay_ms``
    and runs with the original timeout times ``timeout_multiplier``.

    The seeds' default ``retry_on`` listed only TIMEOUT and RESOURCE_ERROR, leaving
    RATE_LIMIT and TRANSIENT_ERROR (transient by the seeds' own classification)
    unretried; the default here is every retryable type. Permanent types are never
    retried: ``validate`` refuses them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)  # shared across threads: immutable

    max_retries: int = 3
    retry_on: list[ToolErrorType] = Field(default_factory=_retryable_types)
    backoff_multiplier: float = 1.5
    initial_delay_ms: int = 1_000
    max_delay_ms: int = 10_000
    timeout_multiplier: float = 2.0
    max_timeout_ms: int = 300_000

    @model_validator(mode="after")
    def _check(self) -> "ToolRetryPolicy":
        self.validate()
        return self

    def validate(self) -> bool:  # type: ignore[override]  # pydantic's is a deprecated classmethod
        """Raise ConfigError (a ValueError) naming the first bad field."""
        require(0 <= self.max_retries <= 100, "max_retries", "must be between 0 and 100")
        require(self.initial_delay_ms >= 0, "initial_delay_ms", "must not be negative")
        require(self.max_delay_ms >= 0, "max_delay_ms", "must not be negative")
        require(
            self.max_delay_ms >= self.initial_delay_ms,
            "max_delay_ms",
            "must be at least initial_delay_ms",
        )
        require(
            math.isfinite(self.backoff_multiplier) and self.backoff_multiplier >= 1,
            "backoff_multiplier",
            "must be a finite number >= 1",
        )
        require(
            math.isfinite(self.timeout_multiplier) and self.timeout_multiplier >= 1,
            "timeout_multiplier",
            "must be a finite number >= 1",
        )
        require(self.max_timeout_ms > 0, "max_timeout_ms", "must be positive")
        permanent = [t.value for t in self.retry_on if t.is_permanent]
        require(not permanent, "retry_on", f"permanent error types are never retried: {permanent}")
        return True

    def should_retry(self, error_type: Union[ToolErrorType, str], attempt: int) -> bool:
        """Whether a failure of ``error_type`` after ``attempt`` retries is retried."""
        try:
            kind = ToolErrorType(error_type)
        except ValueError:
            return False
        return kind in self.retry_on and attempt < self.max_retries

    def get_delay(self, attempt: int) -> int:
        """Milliseconds to wait before retry ``attempt`` (exponential, capped)."""
        return _grow(self.initial_delay_ms, self.backoff_multiplier, attempt, self.max_delay_ms)

    def get_retry_timeout(self, original_timeout: int, attempt: int) -> int:
        """The timeout for retry ``attempt``: grown by timeout_multiplier, capped at
        max_timeout_ms (attempt 0 is the original timeout, also capped)."""
        return _grow(original_timeout, self.timeout_multiplier, attempt, self.max_timeout_ms)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ToolRetryPolicy":
        """Build from a dict (unknown keys refused); raises a ValueError naming the field."""
        return cls.model_validate(dict(data) if isinstance(data, Mapping) else data)


def _grow(base: float, multiplier: float, attempt: int, cap: int) -> int:
    attempt = max(0, int(attempt))
    try:
        value = base * (multiplier**attempt)
    except OverflowError:
        return cap
    if not math.isfinite(value):
        return cap
    return int(min(value, cap))
