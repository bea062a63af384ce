"""The model side of the demo agent.

``AgentModel`` is the protocol the agent loop talks to; ``ScriptedModel`` is a
deterministic policy that plays scripted scenarios: it writes thoughts, emits tool calls
with ids it makes itself (as a real model does) and writes final answers from what the
tools returned. A real LLM client can replace it by implementing ``respond``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Protocol

from .. import ARTIFACT_ID_PATTERN

_ARTIFACT = re.compile(ARTIFACT_ID_PATTERN)


@dataclass
class ModelTurn:
    """One answer of the model: a thought, tool calls, or a final answer."""

    thought: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"id", "name", "args"}
    final_answer: Optional[str] = None
    input_tokens: int = 0
    output_tokens: int = 0
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # per call id: output_level, timeout_ms


class AgentModel(Protocol):
    name: str

    def respond(self, messages: list[dict[str, Any]]) -> ModelTurn: ...


class Observations(list[str]):
    """What a script's functions read: every tool result the model has read, newest
    last, and apart (``this_round``) the results of the calls it made in this round
    that it read (a compression can summarise a result away before it is read)."""

    def __init__(self, seen: Iterable[str] = (), this_round: Iterable[str] = ()) -> None:
        super().__init__(seen)
        self.this_round = list(this_round)


@dataclass
class Call:
    """A tool call the script plans. ``args`` may be a function of what earlier calls
    returned (the observations so far, newest last), e.g. to pass on an artifact id."""

    tool: str
    args: dict[str, Any] | Callable[[list[str]], dict[str, Any]]
    thought: str = ""
    output_level: Optional[str] = None
    timeout_ms: Optional[int] = None
    fault: Optional[str] = None  # a fault the environment will show, e.g. "rate_limit_once"
    on_error: Optional["Call"] = None  # what the model does when this call fails


@dataclass
class RoundScript:
    user_message: str
    calls: list[Call | list[Call]] = field(default_factory=list)  # a list = parallel calls in one message
    final_answer: str | Callable[[list[str]], str] = ""


@dataclass
class Scenario:
    key: str
    language: str
    rounds: list[RoundScript]


def newest_match(observations: list[str], pattern: "re.Pattern[str]", default: str, group: int = 0) -> str:
    """``pattern``'s match (``group``) in the newest observation that has one."""
    for text in reversed(observations):
        found = pattern.search(text)
        if found:
            return found.group(group)
    return default


def last_artifact_id(observations: list[str]) -> str:
    return newest_match(observations, _ARTIFACT, "artifact_0000000000000000")


class ScriptedModel:
    """Plays one round script at a time. Deterministic: the same scenario, conversation
    and round give the same thoughts and the same tool call ids."""

    name = "scripted-analyst-1"

    def __init__(self, *, token_estimate: Callable[[str], int] = lambda text: max(1, len(text) // 4)) -> None:
        self._estimate = token_estimate
        self._script: Optional[RoundScript] = None
        self._queue: list[Call | list[Call]] = []
        self._pending_errors: dict[str, Call] = {}
        self._seed = ""
        self._counter = 0
        self._seen: dict[str, str] = {}  # the round's observations by tool call, in the order read
        self._issued: list[str] = []  # the tool call ids this round's turns made
        self.faults: list[str] = []  # faults the environment should arm before the next tool call

    def start_round(self, script: RoundScript, *, seed: str) -> None:
        self._script = script
        self._queue = list(script.calls)
        self._pending_errors = {}
        self._seed = seed
        self._counter = 0
        self._seen = {}
        self._issued = []

    def _call_id(self) -> str:
        self._counter += 1
        digest = hashlib.sha256(f"{self._seed}:{self._counter}".encode()).hexdigest()
        self._issued.append(f"toolu_{digest[:24]}")
        return self._issued[-1]

    def respond(self, messages: list[dict[str, Any]]) -> ModelTurn:
        if self._script is None:
            raise RuntimeError("start_round() first")
        observations = self._observations(messages)
        input_tokens = sum(self._estimate(json.dumps(m, ensure_ascii=False, default=str)) for m in messages)
        # React to failures of the previous batch first: that is what a model reads last.
        recovery = self._recovery(messages)
        batch = recovery or (self._queue.pop(0) if self._queue else None)
        if batch is None:
            answer = self._script.final_answer
            text = answer(observations) if callable(answer) else answer
            return ModelTurn(final_answer=text, input_tokens=input_tokens, output_tokens=self._estimate(text))
        calls = batch if isinstance(batch, list) else [batch]
        turn = ModelTurn(thought=" ".join(c.thought for c in calls if c.thought), input_tokens=input_tokens)
        self.faults = [c.fault for c in calls if c.fault]
        for call in calls:
            call_id = self._call_id()
            args = call.args(observations) if callable(call.args) else dict(call.args)
            turn.tool_calls.append({"id": call_id, "name": call.tool, "args": args})
            turn.options[call_id] = {"output_level": call.output_level, "timeout_ms": call.timeout_ms}
            if call.on_error is not None:
                self._pending_errors[call_id] = call.on_error
        turn.output_tokens = self._estimate(turn.thought + json.dumps(turn.tool_calls, ensure_ascii=False, default=str))
        return turn

    def _observations(self, messages: list[dict[str, Any]]) -> "Observations":
        """The tool results read so far in this round, newest last: those still in the
        context, and those a compression has since cut or dropped (the model read them
        when they arrived, and answers from what it read)."""
        for position, message in enumerate(messages):
            if message.get("role") == "tool":
                key = str(message.get("tool_call_id") or f"#{position}")
                self._seen.setdefault(key, str(message.get("content", "")))
        return Observations(self._seen.values(), [self._seen[key] for key in self._issued if key in self._seen])

    def _recovery(self, messages: list[dict[str, Any]]) -> Optional[Call]:
        for message in reversed(messages):
            if message.get("role") != "tool":
                break
            plan = self._pending_errors.pop(str(message.get("tool_call_id")), None)
            if plan is not None and str(message.get("content", "")).startswith("Operation failed."):
                return plan
        return None
