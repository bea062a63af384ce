"""Skill activation: the request that carries the chain of skills above it, the
live activation stack of an agent run, and the activator that loads a skill at its
level (through ``_skills.SkillLoader``) and says what to inject and which tools stay
allowed.

Activations can nest (a skill using another); the chain refuses cycles
(a → b → a, including a skill activating itself) and nesting deeper than the limit.
A skill that cannot be loaded gives a failed result, never an exception.

The activator takes any loader with the methods it calls (``SkillSource``), so this
module needs nothing from ``_skills``, whose ``SkillLoader.load_skill`` activates.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Iterator, Literal, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ._exceptions import CircularDependencyError, SkillError
from ._records import SkillActivationRecord
from ._skill_models import (
    SKILL_NAME_RE,
    LoadLevel,
    SkillInstructions,
    SkillMetadata,
    SkillResource,
    cycle_message,
    depth_message,
    validate_skill_name,
)

MAX_ERROR_CHARS = 2000  # a failed result's error is cut to this


# --- activation request and chain ----------------------------------------------------


def _new_activation_id() -> str:
    return f"act_{uuid.uuid4().hex}"


def check_nesting(chain: list[str], skill_name: str, max_depth: int) -> None:
    """Refuse activating ``skill_name`` below ``chain``: a cycle (a → a, a → b → a)
    raises CircularDependencyError, nesting past ``max_depth`` SkillError."""
    if skill_name in chain:
        raise CircularDependencyError(cycle_message(chain + [skill_name]))
    if len(chain) > max_depth:
        raise SkillError(depth_message(max_depth, chain + [skill_name]))


class SkillActivationRequest(BaseModel):
    """A request to activate a skill at a load level, carrying the chain of skills
    that led to it (the call stack, not a history) so nested activations can refuse
    cycles and excessive depth.

    Invariant: ``activation_chain`` holds the ``activation_depth`` skills above this
    one; a top-level request has depth 0 and an empty chain.
    """

    model_config = ConfigDict(extra="forbid")

    skill_name: str
    activation_id: str = Field(default_factory=_new_activation_id, min_length=1, max_length=200)
    load_level: LoadLevel = 2
    activation_depth: int = Field(default=0, ge=0)
    max_depth: int = Field(default=3, ge=0, le=32)
    activation_chain: list[str] = Field(default_factory=list)
    # Level 3 only: resource paths to read now; empty lists what is available instead.
    resources: list[str] = Field(default_factory=list, max_length=64)
    # v2.0's context of the request, carried to nested requests unchanged.
    conversation_id: Optional[str] = Field(default=None, max_length=200)
    user_request: Optional[str] = None
    conversation_history: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("skill_name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not SKILL_NAME_RE.match(value):
            raise ValueError(f"invalid skill name {value[:80]!r}")
        return value

    @field_validator("activation_chain")
    @classmethod
    def _valid_chain(cls, value: list[str]) -> list[str]:
        for name in value:
            if not SKILL_NAME_RE.match(name):
                raise ValueError(f"activation_chain has an invalid skill name {name[:80]!r}")
        return value

    @field_validator("activation_id")
    @classmethod
    def _printable_id(cls, value: str) -> str:
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            raise ValueError("activation_id contains a control character")
        return value

    @model_validator(mode="after")
    def _consistent_chain(self) -> "SkillActivationRequest":
        if len(self.activation_chain) != self.activation_depth:
            raise ValueError("activation_chain must hold exactly activation_depth skills")
        if self.activation_depth > self.max_depth:
            raise ValueError(f"activation_depth exceeds max_depth ({self.max_depth})")
        path = self.activation_chain + [self.skill_name]
        if len(set(path)) != len(path):
            raise ValueError(cycle_message(path))
        return self

    @property
    def path(self) -> list[str]:
        """The chain including this skill: where a nested activation would come from."""
        return [*self.activation_chain, self.skill_name]

    def can_activate_nested(self, skill_name: str) -> bool:
        """True if this skill may activate ``skill_name``: no cycle, direct (a → a)
        or indirect (a → b → a), and the nested depth stays within max_depth."""
        if skill_name in self.path:  # the seeds forgot the skill itself: a → a slipped through
            return False
        return self.activation_depth + 1 <= self.max_depth

    def create_nested_request(
        self,
        nested_skill: str,
        activation_id: Optional[str] = None,
        *,
        load_level: Optional[LoadLevel] = None,
    ) -> "SkillActivationRequest":
        """The request for a skill this one activates, with the chain extended.
        A cycle raises CircularDependencyError, too deep a nesting SkillError (both
        ValueErrors, as in the design)."""
        validate_skill_name(nested_skill)
        check_nesting(self.path, nested_skill, self.max_depth)
        return SkillActivationRequest(
            skill_name=nested_skill,
            activation_id=activation_id or _new_activation_id(),
            load_level=self.load_level if load_level is None else load_level,
            activation_depth=self.activation_depth + 1,
            max_depth=self.max_depth,
            activation_chain=self.path,
            conversation_id=self.conversation_id,
            user_request=self.user_request,
            conversation_history=self.conversation_history,
        )


class SkillActivationStack:
    """The live stack of skill activations in one agent run: push when a skill is
    activated, pop when it is done.

    ``max_depth`` counts nesting below the top-level activation, as in
    SkillActivationRequest, so the stack holds at most max_depth + 1 activations.
    """

    def __init__(self, max_depth: int = 3) -> None:
        if max_depth < 0:
            raise SkillError("max_depth must be >= 0")
        self.max_depth = max_depth
        self._frames: list[tuple[str, str, datetime]] = []
        self._lock = threading.Lock()

    @property
    def current_chain(self) -> list[str]:
        with self._lock:
            return [frame[0] for frame in self._frames]

    @property
    def depth(self) -> int:
        """How many activations are on the stack."""
        with self._lock:
            return len(self._frames)

    def __len__(self) -> int:
        return self.depth

    def push(self, skill_name: str, activation_id: str) -> bool:
        """Push an activation; True (the design's return). A cycle raises
        CircularDependencyError, too deep a nesting SkillError (both ValueErrors)."""
        validate_skill_name(skill_name)
        with self._lock:
            check_nesting([frame[0] for frame in self._frames], skill_name, self.max_depth)
            self._frames.append((skill_name, activation_id, datetime.now()))
        return True

    def pop(self, skill_name: str, activation_id: Optional[str] = None) -> bool:
        """Pop the top activation, which must be ``skill_name`` (and ``activation_id``
        when given): a mismatch means activations were not nested properly and raises
        SkillError (the design logged it and returned False). True otherwise."""
        with self._lock:
            if not self._frames:
                raise SkillError(f"cannot pop {skill_name!r}: no skill is active")
            top_name, top_id, _ = self._frames[-1]
            if top_name != skill_name or (activation_id is not None and top_id != activation_id):
                raise SkillError(
                    f"skill stack mismatch: popping {skill_name!r} ({activation_id}) "
                    f"but {top_name!r} ({top_id}) is on top"
                )
            self._frames.pop()
        return True

    # The design's names.
    def contains(self, skill_name: str) -> bool:
        with self._lock:
            return any(frame[0] == skill_name for frame in self._frames)

    def get_stack_names(self) -> list[str]:
        return self.current_chain

    def get_chain(self) -> list[str]:
        return self.current_chain

    def get_depth(self) -> int:
        return self.depth

    def __enter__(self) -> "SkillActivationStack":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """Leaving ``with SkillActivationStack() as stack:`` empties the stack."""
        with self._lock:
            self._frames.clear()

    @contextmanager
    def activate(self, skill_name: str, activation_id: Optional[str] = None) -> Iterator[str]:
        """``with stack.activate("a"):`` pushes, and pops even if the body raises."""
        activation_id = activation_id or _new_activation_id()
        self.push(skill_name, activation_id)
        try:
            yield activation_id
        finally:
            self.pop(skill_name, activation_id)

    def request_for(
        self, skill_name: str, *, load_level: LoadLevel = 2, activation_id: Optional[str] = None
    ) -> SkillActivationRequest:
        """A request for activating ``skill_name`` from where the stack is now."""
        chain = self.current_chain
        check_nesting(chain, skill_name, self.max_depth)
        return SkillActivationRequest(
            skill_name=skill_name,
            activation_id=activation_id or _new_activation_id(),
            load_level=load_level,
            activation_depth=len(chain),
            max_depth=self.max_depth,
            activation_chain=chain,
        )


# --- activation result ---------------------------------------------------------------


class ContextModifier(BaseModel):
    """How an active skill changes the agent's execution context.

    ``allowed_tools`` is read by the ToolExecutor: None means no restriction.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_tools: Optional[frozenset[str]] = None
    model: Optional[str] = None
    disable_model_invocation: bool = False

    @classmethod
    def from_metadata(cls, metadata: SkillMetadata) -> "ContextModifier":
        tools = None if metadata.allowed_tools is None else frozenset(metadata.allowed_tools)
        return cls(
            allowed_tools=tools,
            model=metadata.model,
            disable_model_invocation=metadata.disable_model_invocation,
        )

    def allows(self, tool_name: str) -> bool:
        return self.allowed_tools is None or tool_name in self.allowed_tools


class SkillMessage(BaseModel):
    """One message an activation injects. Hidden messages reach the model but are
    not shown to the user (the skill body is instructions, not conversation)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["metadata", "instruction", "resource", "permissions"]
    content: str
    visibility: Literal["visible", "hidden"] = "visible"


class SkillActivationResult(BaseModel):
    """What an activation loaded and what the agent injects; failures are results."""

    model_config = ConfigDict(extra="forbid")

    skill_name: str
    activation_id: str
    load_level: LoadLevel = 2  # the design's result has no level: the default request's
    messages: list[SkillMessage] = Field(default_factory=list)
    context_modifier: ContextModifier = Field(default_factory=ContextModifier)
    # Tokens of the skill material loaded (summary, body, resources or their index);
    # the short framing lines around them are not counted.
    tokens_loaded: int = Field(default=0, ge=0)
    resources: list[str] = Field(default_factory=list)  # resource paths read
    success: bool = True
    error: Optional[str] = None
    duration_ms: float = Field(default=0.0, ge=0)
    activation_depth: int = Field(default=0, ge=0)
    activation_chain: list[str] = Field(default_factory=list)

    def to_llm_messages(self) -> list[dict[str, Any]]:
        """Dict messages for the model. Hidden ones carry ``"isMeta": True`` (also in
        ``additional_kwargs`` for LangChain). All are user-role: the seeds' assistant
        role for hidden ones would put words in the model's mouth, and several
        providers refuse an assistant message last."""
        converted: list[dict[str, Any]] = []
        for message in self.messages:
            item: dict[str, Any] = {"role": "user", "content": message.content}
            if message.visibility == "hidden":
                item["isMeta"] = True
                item["additional_kwargs"] = {"isMeta": True}
            converted.append(item)
        return converted

    def to_record(
        self,
        conversation_id: str,
        round_id: Optional[str] = None,
        *,
        trace_id: Optional[str] = None,
        span_id: Optional[str] = None,
        occurred_at: Optional[datetime] = None,
    ) -> SkillActivationRecord:
        """The dashboard record of this activation."""
        extra: dict[str, Any] = {} if occurred_at is None else {"occurred_at": occurred_at}
        return SkillActivationRecord(
            conversation_id=conversation_id,
            round_id=round_id,
            trace_id=trace_id,
            span_id=span_id,
            skill_name=self.skill_name,
            activation_id=self.activation_id,
            load_level=self.load_level,
            depth=self.activation_depth,
            chain=list(self.activation_chain),
            tokens_loaded=self.tokens_loaded,
            resources=list(self.resources),
            success=self.success,
            error=self.error,
            duration_ms=self.duration_ms,
            **extra,
        )


# --- activator -----------------------------------------------------------------------


class SkillSource(Protocol):
    """What the activator reads a skill through (``pipeline.SkillLoader`` is one)."""

    def load_metadata(self, name: str) -> SkillMetadata: ...

    def load_full(self, name: str) -> SkillInstructions: ...

    def load_resource(self, name: str, relative_path: str) -> SkillResource: ...

    def list_resources(self, name: str) -> list[str]: ...

    def count_tokens(self, text: str) -> int: ...


class SkillActivator:
    """Performs activations: loads the requested level, builds the messages and the
    context modifier, and times it. A skill that cannot be loaded (missing,
    malformed, a refused resource) gives a failed result, never an exception, so the
    agent can tell the model and carry on."""

    def __init__(self, loader: SkillSource, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.loader = loader
        self._clock = clock

    def activate(self, request: SkillActivationRequest) -> SkillActivationResult:
        started = self._clock()
        base = {
            "skill_name": request.skill_name,
            "activation_id": request.activation_id,
            "load_level": request.load_level,
            "activation_depth": request.activation_depth,
            "activation_chain": list(request.activation_chain),
        }
        try:
            loaded = self._load(request)
        except (SkillError, OSError) as exc:  # OSError: unreadable files, permissions
            error = str(exc) if isinstance(exc, SkillError) else f"cannot read skill {request.skill_name!r}: {exc}"
            return SkillActivationResult(
                **base,
                success=False,
                error=error[:MAX_ERROR_CHARS],
                duration_ms=self._elapsed_ms(started),
            )
        messages, modifier, tokens, resources = loaded
        return SkillActivationResult(
            **base,
            messages=messages,
            context_modifier=modifier,
            tokens_loaded=tokens,
            resources=resources,
            duration_ms=self._elapsed_ms(started),
        )

    def _elapsed_ms(self, started: float) -> float:
        return max(0.0, (self._clock() - started) * 1000.0)

    def _load(
        self, request: SkillActivationRequest
    ) -> tuple[list[SkillMessage], ContextModifier, int, list[str]]:
        name = request.skill_name
        if request.load_level == 1:
            metadata = self.loader.load_metadata(name)
            tokens = metadata.tokens
        else:
            instructions = self.loader.load_full(name)
            metadata = instructions.metadata
            tokens = metadata.tokens + instructions.tokens
        messages = [
            SkillMessage(type="metadata", content=f'The "{name}" skill is loading: {metadata.description}')
        ]
        if request.load_level >= 2:
            messages.append(SkillMessage(type="instruction", content=instructions.body, visibility="hidden"))
        resources: list[str] = []
        if request.load_level == 3:
            if request.resources:
                for path in request.resources:
                    resource = self.loader.load_resource(name, path)
                    tokens += resource.tokens
                    resources.append(resource.path)
                    messages.append(
                        SkillMessage(
                            type="resource",
                            content=f'<skill-resource path="{resource.path}">\n{resource.content}\n</skill-resource>',
                            visibility="hidden",
                        )
                    )
            else:
                available = self.loader.list_resources(name)
                index = "\n".join(f"- {path}" for path in available) or "(none)"
                content = f'Resources of the "{name}" skill, readable on request:\n{index}'
                tokens += self.loader.count_tokens(content)
                messages.append(SkillMessage(type="resource", content=content, visibility="hidden"))
        modifier = ContextModifier.from_metadata(metadata)
        if modifier.allowed_tools is not None:
            tools = ", ".join(sorted(modifier.allowed_tools)) or "(none)"
            messages.append(
                SkillMessage(
                    type="permissions",
                    content=f'While the "{name}" skill is active, the tools you may use are: {tools}',
                    visibility="hidden",
                )
            )
        return messages, modifier, tokens, resources
