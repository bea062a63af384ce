"""A score: someone's (or something's) judgement of what an agent did.

``ScoreRecord`` is the item schema of ``POST /api/v1/scores``: the dashboard imports
it, as it does the records, so both sides read one schema. A score has a name, a
value (a number, a boolean) and/or a label (a category), an optional comment, and
names what it judges: a conversation, one of its rounds, a tool call, a span (trace
and span id), or the model response with a given ``response_id``. ``score_id`` is
the client's: sending the same score again stores it once, and sending the same id
with another value is an edit (the dashboard keeps who changed what).
"""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

from ._records import Identifier, SpanId, TraceId, _now, _require_aware

MAX_LABEL = 200
MAX_COMMENT = 10_000
MAX_SCORES_PER_BATCH = 1_000  # what the dashboard takes in one request by default

Label = Annotated[str, Field(min_length=1, max_length=MAX_LABEL, pattern=r"^[^\x00-\x1f\x7f]+$")]


def _score_id() -> str:
    return str(uuid.uuid4())


class ScoreRecord(BaseModel):
    """One score, as an agent, an evaluator or a script sends it.

    ``value`` is a number or a boolean; ``label`` a category ("correct", "4 stars").
    At least one of them is set; both may be (an evaluator's 0.2 labelled
    "irrelevant"). A string ``value`` is read as the label. The target is the most
    precise thing named: ``span_id`` (with ``trace_id``), else ``tool_call_id``,
    else ``round_id`` (with ``conversation_id``), else ``response_id``, else the
    whole trace (``trace_id``), else ``conversation_id``.
    """

    model_config = ConfigDict(extra="forbid")

    score_id: Identifier = Field(default_factory=_score_id)
    name: Identifier
    value: Optional[Union[StrictBool, StrictInt, StrictFloat]] = None
    label: Optional[Label] = None
    comment: Optional[str] = Field(default=None, max_length=MAX_COMMENT)
    conversation_id: Optional[Identifier] = None
    round_id: Optional[Identifier] = None
    tool_call_id: Optional[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]] = None
    trace_id: Optional[TraceId] = None
    span_id: Optional[SpanId] = None
    response_id: Optional[Identifier] = None
    occurred_at: datetime = Field(default_factory=_now)

    @model_validator(mode="before")
    @classmethod
    def _string_value_is_a_label(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("value"), str):
            if data.get("label") not in (None, data["value"]):
                raise ValueError("value is a string and label another: send the category once, as label")
            data = {**data, "label": data["value"], "value": None}
        return data

    @field_validator("value")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("value must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
            raise ValueError("value is too large")
        return value

    @field_validator("occurred_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        _require_aware(value, "occurred_at")
        return value

    @model_validator(mode="after")
    def _complete(self) -> ScoreRecord:
        if self.value is None and self.label is None:
            raise ValueError("a score needs a value or a label")
        if self.span_id and not self.trace_id:
            raise ValueError("span_id needs trace_id")
        if self.round_id and not self.conversation_id:
            raise ValueError("round_id needs conversation_id")
        if not (self.conversation_id or self.trace_id or self.tool_call_id or self.response_id):
            raise ValueError("name what is scored: conversation_id, round_id, tool_call_id, trace_id/span_id "
                             "or response_id")
        return self

    @property
    def target(self) -> str:
        """What the score judges: span, tool_call, round, response, trace or conversation."""
        if self.span_id:
            return "span"
        if self.tool_call_id:
            return "tool_call"
        if self.round_id:
            return "round"
        if self.response_id:
            return "response"
        if self.trace_id:
            return "trace"
        return "conversation"
