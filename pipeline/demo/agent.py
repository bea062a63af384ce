"""The demo agent: a plain ReAct loop that drives the real pipeline.

Nothing here is demo-specific except the faults a scripted model announces: any
``AgentModel`` (a real LLM client included) can be plugged in. Per round the loop
counts the context, compresses it when it passes the threshold, asks the model,
runs its tool calls through the ToolExecutor (the ``Skill`` pseudo-tool through the
skills module), and reports every step to the dashboard as records and spans.

What the dashboard does (down, slow, answering 500) never reaches this loop: the
exporter queues in memory and sends from its own thread, spans are batched by the
OpenTelemetry SDK, and the remote config keeps the last good config.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

from .. import (
    AdvancedContextManager,
    ArtifactStore,
    CircularDependencyError,
    CompressionMode,
    CompressionRecord,
    ContextCompressionConfig,
    ContextModifier,
    DynamicTokenCounter,
    IdempotencyCache,
    LevelRendering,
    MessageRecord,
    ObservabilityConfig,
    OutputLevel,
    RoundRecord,
    SkillActivationResult,
    SkillActivationStack,
    SkillActivator,
    SkillError,
    SkillLoader,
    Telemetry,
    ToolCachePolicy,
    ToolCall,
    ToolError,
    ToolErrorResponse,
    ToolErrorType,
    ToolExecutionResult,
    ToolExecutor,
    ToolInvocationRequest,
    ToolResultHook,
    ToolRetryPolicy,
    configure_telemetry,
    get_token_counter,
)
from .._observability import _store_reader
from .model import AgentModel, ModelTurn, Scenario
from .tools import DemoTools

logger = logging.getLogger("pipeline.demo")

SKILL_TOOL = "Skill"
MAX_STEPS_PER_ROUND = 16  # a model that never answers must not loop forever
DEFAULT_CONTEXT_WINDOW = 1_600  # small on purpose: the long scenarios must compress
SKILLS_DIR = Path(__file__).resolve().parent / "skills"
_PRINTABLE = re.compile(r"[\x00-\x1f\x7f]")
# The automatic check scored on each round that ran a tool (answer_quotes_tool_figure).
GROUNDED_SCORE = "answer_quotes_tool_figure"
_FIGURE = re.compile(r"(?<![0-9.])\d[\d,]*(?:\.\d+)?")

# How each demo tool is registered: caching where a repeat is really the same answer.
TOOL_SETTINGS: dict[str, dict[str, Any]] = {
    "query_database": {"cache_policy": ToolCachePolicy.TTL_MEDIUM, "timeout_ms": 8_000},
    "web_search": {"cache_policy": ToolCachePolicy.TTL_SHORT, "timeout_ms": 5_000},
    "vector_search": {"cache_policy": ToolCachePolicy.TTL_MEDIUM, "timeout_ms": 5_000},
    "file_reader": {"cache_policy": ToolCachePolicy.TTL_MEDIUM, "timeout_ms": 5_000},
    "calculator": {"cache_policy": ToolCachePolicy.NO_CACHE, "timeout_ms": 1_000},
}

# Retries short enough for a demo, long enough to be seen on the timeline.
DEMO_RETRY_POLICY = ToolRetryPolicy(max_retries=2, initial_delay_ms=150, max_delay_ms=1_000, backoff_multiplier=2.0)


def demo_compression_config(window: int = DEFAULT_CONTEXT_WINDOW) -> ContextCompressionConfig:
    """How the demo compresses: summarise past 80% of the window down to half of it,
    keeping the last four messages. The dashboard's demo setup serves the same
    config as the project's active compression profile (``manage.py seed_demo``)."""
    return ContextCompressionConfig(
        strategy=CompressionMode.SUMMARIZE, max_tokens=window, threshold_ratio=0.8, target_ratio=0.5, keep_recent=4
    )


def _rate_limit(tools: DemoTools) -> None:
    tools.search_faults.fail_next(
        ToolError(ToolErrorType.RATE_LIMIT, "429 Too Many Requests: search quota exceeded, retry later", code="HTTP_429")
    )


def _flaky_connection(tools: DemoTools) -> None:
    tools.search_faults.fail_next(ConnectionResetError("connection reset by the search service"))


# Faults a scripted model can announce; the environment arms them before the calls.
FAULTS: dict[str, Callable[[DemoTools], None]] = {
    "rate_limit_once": _rate_limit,
    "connection_reset_once": _flaky_connection,
}


@dataclass
class AgentStats:
    """What the agent did, for the summary line (counted here, not by the dashboard)."""

    conversations: int = 0
    rounds: int = 0
    failed_rounds: int = 0
    tool_calls: int = 0
    errors: int = 0
    retries: int = 0
    cache_hits: int = 0
    compressions: int = 0
    skill_activations: int = 0
    refused_activations: int = 0
    artifacts: int = 0
    records: int = 0
    scores: int = 0

    def add(self, other: "AgentStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class _Conversation:
    """One conversation's state: the working message list and what stays in force."""

    conversation_id: str
    user_id: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    next_index: int = 0  # position of the next message in the whole conversation
    modifier: Optional[ContextModifier] = None  # the last activated skill's


@dataclass
class _Round:
    round_id: str
    index: int
    trace_id: Optional[str]
    stack: SkillActivationStack
    tool_hook: ToolResultHook  # turns each tool execution into a span, a record, an upload
    thoughts: list[str] = field(default_factory=list)
    tool_calls: int = 0
    observations: list[str] = field(default_factory=list)  # what the round's tools returned (successes)
    context_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


class _Outbox:
    """Where the agent's records and artifacts go: counted here (the summary line
    needs no dashboard), passed on to the exporter when there is one. Each artifact
    is counted and uploaded once, however many cache hits point to it."""

    def __init__(self, exporter: Any, stats: AgentStats, artifact_store: Any) -> None:
        self.exporter = exporter
        self.stats = stats
        self._read_artifact = _store_reader(artifact_store)
        self._uploaded: set[str] = set()

    def submit(self, record: Any) -> None:
        self.stats.records += 1
        if self.exporter is not None:
            self.exporter.submit(record)

    def upload_artifact(self, artifact_id: str, data: bytes, content_type: str) -> None:
        if self.exporter is not None:
            self.exporter.upload_artifact(artifact_id, data, content_type)

    def score(self, name: str, value: Any, **fields: Any) -> None:
        """A score of the agent's own checks (an exporter without ``score`` gets none)."""
        self.stats.scores += 1
        send = getattr(self.exporter, "score", None)
        if send is not None:
            send(name, value, **fields)

    def artifact_to_upload(self, artifact_id: str) -> Optional[tuple[bytes, str]]:
        """The hook's ``read_artifact``: the bytes of an artifact not seen before."""
        if artifact_id in self._uploaded:
            return None
        self._uploaded.add(artifact_id)
        self.stats.artifacts += 1
        return self._read_artifact(artifact_id) if self.exporter is not None else None


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _digest(*parts: str) -> str:
    return hashlib.sha256(":".join(parts).encode("utf-8")).hexdigest()


def _shown_name(value: Any) -> str:
    """A skill name the model sent, safe to put in a record even when it is junk."""
    text = value if isinstance(value, str) else repr(value)
    text = _PRINTABLE.sub("?", text).strip()[:64]
    return text or "(missing)"


class DemoAgent:
    """A ReAct agent over the pipeline. Build it with ``DemoAgent.create`` or wire
    the parts yourself; ``run_conversation`` plays one scenario.

    ``exporter`` is anything with ``submit(record)`` and ``upload_artifact(id, bytes,
    content_type)`` (a RecordExporter); ``telemetry`` a pipeline Telemetry.
    """

    def __init__(
        self,
        *,
        model: AgentModel,
        tools: DemoTools,
        executor: ToolExecutor,
        context_manager: AdvancedContextManager,
        skill_activator: SkillActivator,
        token_counter: DynamicTokenCounter,
        telemetry: Telemetry,
        exporter: Any = None,
        agent_name: str = "demo-analyst",
    ) -> None:
        self.model = model
        self.tools = tools
        self.executor = executor
        self.context_manager = context_manager
        self.skill_activator = skill_activator
        self.token_counter = token_counter
        self.telemetry = telemetry
        self.exporter = exporter
        self.agent_name = agent_name
        self.stats = AgentStats()
        self._outbox = _Outbox(exporter, self.stats, executor.artifact_store)
        # Renderings of results by idempotency key: a cache hit answers from the
        # cache without the raw data, and the level comparison still wants all three.
        self._renderings: OrderedDict[str, list[LevelRendering]] = OrderedDict()

    @classmethod
    def create(
        cls,
        *,
        model: AgentModel,
        database_path: Path,
        artifact_dir: Path,
        exporter: Any = None,
        telemetry: Optional[Telemetry] = None,
        context_window: Optional[int] = None,
        compression: Optional[ContextCompressionConfig] = None,
        skills_dir: Path = SKILLS_DIR,
        token_counter: Optional[DynamicTokenCounter] = None,
        retry_policy: ToolRetryPolicy = DEMO_RETRY_POLICY,
    ) -> "DemoAgent":
        """The agent with the demo's tools, registered with their cache policies."""
        counter = token_counter or get_token_counter()
        store = ArtifactStore(artifact_dir)
        tools = DemoTools(database_path, artifact_reader=store.retrieve)
        executor = ToolExecutor(
            token_counter=counter,
            artifact_store=store,
            idempotency_cache=IdempotencyCache(),
            retry_policy=retry_policy,
            model=model.name,
        )
        for name, func in tools.as_dict().items():
            executor.register(name, func, **TOOL_SETTINGS.get(name, {}))
        window = context_window or getattr(model, "context_window", None) or DEFAULT_CONTEXT_WINDOW
        config = compression or demo_compression_config(window)
        context_manager = AdvancedContextManager(config, token_counter=counter, model=model.name)
        activator = SkillActivator(SkillLoader(skills_dir, token_counter=counter, model=model.name))
        return cls(
            model=model,
            tools=tools,
            executor=executor,
            context_manager=context_manager,
            skill_activator=activator,
            token_counter=counter,
            telemetry=telemetry or configure_telemetry(ObservabilityConfig(enabled=False), shutdown_on_exit=False),
            exporter=exporter,
        )

    # ------------------------------------------------------------------ the loop

    @property
    def context_window(self) -> int:
        # The compression config may be replaced by the remote config at any time.
        return self.context_manager.config.max_tokens

    def run_conversation(self, scenario: Scenario, *, conversation_id: str, user_id: str) -> AgentStats:
        """Play every round of ``scenario`` as one conversation; returns its stats."""
        before = AgentStats(**vars(self.stats))
        conversation = _Conversation(conversation_id, user_id)
        self._append(conversation, {"role": "system", "content": self._system_prompt()}, None)
        for index, script in enumerate(scenario.rounds):
            start_round = getattr(self.model, "start_round", None)
            if callable(start_round):
                start_round(script, seed=f"{conversation_id}:{index}")
            self._run_round(conversation, index, script.user_message)
        self.stats.conversations += 1
        delta = AgentStats(**vars(self.stats))
        for f in fields(delta):
            setattr(delta, f.name, getattr(delta, f.name) - getattr(before, f.name))
        return delta

    def _system_prompt(self) -> str:
        # Progressive disclosure: the model sees each skill's one-line summary only.
        try:
            skills = "\n".join(f"- {m.summary}" for m in self.skill_activator.loader.list_skills())
        except (SkillError, OSError):
            skills = "(none)"
        tools = ", ".join(self.executor.tool_names)
        return (
            "You are a business analyst. Answer from data: use the tools, quote numbers, be brief.\n"
            f"Tools: {tools}. Load a skill with the Skill tool ({{\"name\", \"level\"}}) before using it.\n"
            f"Skills:\n{skills}"
        )

    def _run_round(self, conversation: _Conversation, index: int, user_message: str) -> None:
        round_id = f"{conversation.conversation_id}-r{index}"
        started = _now()
        final_answer: Optional[str] = None
        status = "ok"
        with self.telemetry.agent_span(conversation.conversation_id, round_id, agent_name=self.agent_name) as span:
            tool_hook = ToolResultHook(
                conversation_id=conversation.conversation_id,
                round_id=round_id,
                telemetry=self.telemetry,
                exporter=self._outbox,  # type: ignore[arg-type]  # duck-typed: submit / upload_artifact
                model=self.model.name,
                read_artifact=self._outbox.artifact_to_upload,
            )
            state = _Round(round_id, index, span.trace_id, SkillActivationStack(max_depth=3), tool_hook)
            self._append(conversation, {"role": "user", "content": user_message}, round_id)
            try:
                final_answer = self._react(conversation, state)
            except Exception as exc:  # a model or agent bug ends this round, not the run
                logger.exception("round %s failed", round_id)
                span.fail(type(exc).__name__, str(exc))
                status = "error"
            else:
                if final_answer is None:
                    span.fail("no_final_answer", f"no answer after {MAX_STEPS_PER_ROUND} steps")
                    status = "error"
            finally:
                for name in reversed(state.stack.current_chain):
                    state.stack.pop(name)
            if status == "error":
                self.stats.failed_rounds += 1
            span.record_usage(state.input_tokens, state.output_tokens)
            self._outbox.submit(
                RoundRecord(
                    conversation_id=conversation.conversation_id,
                    round_id=round_id,
                    index=index,
                    trace_id=state.trace_id,
                    model=self.model.name,
                    user_id=conversation.user_id,
                    user_message=user_message,
                    thoughts=state.thoughts,
                    final_answer=final_answer,
                    status=status,
                    context_tokens=state.context_tokens,
                    context_window=self.context_window,
                    compression_threshold=self.context_manager.config.threshold_ratio,
                    input_tokens=state.input_tokens,
                    output_tokens=state.output_tokens,
                    started_at=started,
                    ended_at=_now(),
                )
            )
            if state.tool_calls:  # nothing to check an answer against in a round that ran no tool
                passed, why = answer_quotes_tool_figure(final_answer, state.observations)
                self._outbox.score(GROUNDED_SCORE, passed, comment=why,
                                   conversation_id=conversation.conversation_id, round_id=round_id)
        self.stats.rounds += 1

    def _react(self, conversation: _Conversation, state: _Round) -> Optional[str]:
        """Think, act, observe until the model answers; None if it never does."""
        for _ in range(MAX_STEPS_PER_ROUND):
            tokens = self._compress_if_needed(conversation, state)
            state.context_tokens = max(state.context_tokens, tokens)
            with self.telemetry.chat_span(self.model.name, conversation.conversation_id, state.round_id) as chat:
                turn: ModelTurn = self.model.respond(list(conversation.messages))
                chat.record_usage(turn.input_tokens, turn.output_tokens)
            state.input_tokens += turn.input_tokens
            state.output_tokens += turn.output_tokens
            if turn.thought:
                state.thoughts.append(turn.thought)
            if turn.final_answer is not None or not turn.tool_calls:
                answer = turn.final_answer if turn.final_answer is not None else turn.thought
                self._append(conversation, {"role": "assistant", "content": answer}, state.round_id)
                return answer
            calls = [{"id": c["id"], "name": c["name"], "args": dict(c.get("args") or {})} for c in turn.tool_calls]
            self._append(
                conversation, {"role": "assistant", "content": turn.thought, "tool_calls": calls}, state.round_id
            )
            self._arm_faults()
            injected: list[dict[str, Any]] = []
            for call in calls:
                if call["name"] == SKILL_TOOL:
                    tool_message, extra = self._activate_skill(conversation, state, call)
                    injected.extend(extra)
                else:
                    tool_message = self._execute_tool(conversation, state, call, turn.options.get(call["id"], {}))
                self._append(conversation, tool_message, state.round_id)
            self.tools.search_faults.clear()  # a fault belongs to the calls it was announced for
            # Skill material goes after all tool answers: tool messages must follow their call.
            for message in injected:
                self._append(conversation, message, state.round_id)
        return None

    def _arm_faults(self) -> None:
        for name in getattr(self.model, "faults", None) or ():
            arm = FAULTS.get(name)
            if arm is None:
                logger.warning("unknown fault %r announced by the model; ignored", name)
            else:
                arm(self.tools)

    # ------------------------------------------------------------------ context

    def _compress_if_needed(self, conversation: _Conversation, state: _Round) -> int:
        """The context's tokens as sent to the model, compressed first when over the threshold."""
        tokens = self.token_counter.count_conversation_tokens(conversation.messages, self.model.name)
        config = self.context_manager.config
        if not config.should_compress(tokens):
            return tokens
        with self.telemetry.compression_span(
            conversation.conversation_id, config.strategy, state.round_id, tokens_before=tokens
        ) as span:
            messages, result = self.context_manager.compress_with_result(conversation.messages)
            span.record_compression(result)
        result.model = self.model.name
        conversation.messages = messages
        self.stats.compressions += 1
        self._outbox.submit(
            CompressionRecord(
                conversation_id=conversation.conversation_id,
                round_id=state.round_id,
                trace_id=span.trace_id,
                span_id=span.span_id,
                result=result,
            )
        )
        return self.token_counter.count_conversation_tokens(messages, self.model.name)

    def _append(self, conversation: _Conversation, message: dict[str, Any], round_id: Optional[str]) -> None:
        conversation.messages.append(message)
        index = conversation.next_index
        conversation.next_index += 1
        self._outbox.submit(
            MessageRecord(
                conversation_id=conversation.conversation_id,
                round_id=round_id,
                index=index,
                role=message["role"],
                content=str(message.get("content") or ""),
                name=message.get("name"),
                tool_calls=[ToolCall(**call) for call in message.get("tool_calls", [])],
                tool_call_id=message.get("tool_call_id"),
                is_meta=bool(message.get("isMeta", False)),
                tokens=self.token_counter.count_message_tokens(message, self.model.name),
            )
        )

    # ------------------------------------------------------------------ tools

    def _execute_tool(
        self, conversation: _Conversation, state: _Round, call: dict[str, Any], options: dict[str, Any]
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {"caller_id": conversation.user_id}  # the cache is per user
        if options.get("output_level"):
            extra["output_level"] = OutputLevel(options["output_level"])
        if options.get("timeout_ms"):
            extra["timeout_ms"] = int(options["timeout_ms"])
        try:
            request = ToolInvocationRequest.from_tool_call(call, **extra)
        except (ValueError, TypeError) as exc:  # the model sent junk: tell it, as a tool error
            result = ToolErrorResponse(
                tool_call_id=call["id"],
                error_type=ToolErrorType.INVALID_PARAMETERS,
                error_code="BAD_TOOL_CALL",
                error_message=f"malformed tool call: {str(exc)[:300]}",
            ).to_result()
            self._count_result(result)
            return _tool_message(call, result)
        usage = self.token_counter.count_conversation_tokens(conversation.messages, self.model.name)
        result, renderings = self.executor.execute_with_renderings(
            request, context_usage=min(1.0, usage / self.context_window), context_modifier=conversation.modifier
        )
        self._count_result(result)
        state.tool_calls += 1
        if result.success:
            state.observations.append(result.observation)
        state.tool_hook.handle(request, result, self._all_renderings(request, result, renderings))
        return _tool_message(call, result)

    def _all_renderings(
        self, request: ToolInvocationRequest, result: ToolExecutionResult, renderings: list[LevelRendering]
    ) -> list[LevelRendering]:
        """BRIEF, STANDARD and FULL for every call: a fresh result brings its own, a
        cache hit reuses those of the call it came from, and an error reads the same
        at every level (there is no data to render)."""
        if not result.success:
            return [
                LevelRendering(level=level, observation=result.observation, tokens=result.observation_tokens)
                for level in OutputLevel
            ]
        key = request.get_or_generate_idempotency_key()
        if len(renderings) == len(OutputLevel):
            self._renderings[key] = renderings
            self._renderings.move_to_end(key)
            while len(self._renderings) > 2_000:
                self._renderings.popitem(last=False)
            return renderings
        return self._renderings.get(key, renderings)

    def _count_result(self, result: ToolExecutionResult) -> None:
        self.stats.tool_calls += 1
        self.stats.retries += result.retry_count
        self.stats.errors += 0 if result.success else 1
        self.stats.cache_hits += 1 if result.cache_hit else 0

    # ------------------------------------------------------------------ skills

    def _activate_skill(
        self, conversation: _Conversation, state: _Round, call: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Handle the Skill pseudo-tool: activate, nest on the round's stack, refuse
        cycles. Returns the tool answer and the messages the skill injects."""
        args = call["args"]
        name, level = args.get("name"), args.get("level", 2)
        shown = _shown_name(name)
        activation_id = f"act_{_digest(call['id'])[:24]}"
        chain = state.stack.current_chain
        valid_level = level in (1, 2, 3) and not isinstance(level, bool)
        shown_level = level if valid_level else 1
        with self.telemetry.skill_span(
            shown, conversation.conversation_id, level=shown_level, round_id=state.round_id, depth=len(chain)
        ) as span:
            try:
                if not valid_level:
                    raise SkillError(f"level must be 1, 2 or 3, got {str(level)[:20]!r}")
                request = state.stack.request_for(name, load_level=level, activation_id=activation_id)
                result = self.skill_activator.activate(request)
            except (CircularDependencyError, SkillError, ValueError, TypeError) as exc:
                # A refused activation (a cycle, too deep, a bad name) is recorded as failed.
                result = SkillActivationResult(
                    skill_name=shown,
                    activation_id=activation_id,
                    load_level=shown_level,
                    success=False,
                    error=_first_line(exc),
                    activation_depth=len(chain),
                    activation_chain=chain,
                )
            span.record_skill(tokens_loaded=result.tokens_loaded, success=result.success, error=result.error)
        self.stats.skill_activations += 1
        self._outbox.submit(
            result.to_record(
                conversation.conversation_id, state.round_id, trace_id=span.trace_id, span_id=span.span_id
            )
        )
        if not result.success:
            self.stats.refused_activations += 1
            failure = ToolErrorResponse(
                tool_call_id=call["id"],
                error_type=ToolErrorType.VALIDATION_ERROR,
                error_code="SKILL_REFUSED",
                error_message=result.error or "skill activation failed",
            ).to_result()
            return _tool_message(call, failure), []
        state.stack.push(result.skill_name, result.activation_id)
        conversation.modifier = result.context_modifier  # in force until another skill
        answer = (
            f'Skill "{result.skill_name}" activated at level {result.load_level} '
            f"({result.tokens_loaded} tokens loaded)."
        )
        message = {"role": "tool", "tool_call_id": call["id"], "name": SKILL_TOOL, "content": answer, "status": "success"}
        return message, result.to_llm_messages()


def answer_quotes_tool_figure(answer: Optional[str], observations: list[str]) -> tuple[bool, str]:
    """The demo's automatic check of a round: does the answer quote a figure (a
    number of two digits or more) that one of the round's tools returned? Returns
    the verdict and why, in words for the score's comment."""
    if not answer:
        return False, "the round has no answer"
    returned = {value for text in observations for value in _figures(text)}
    quoted = _figures(answer)
    if not quoted:
        return False, "the answer quotes no figure"
    found = [value for value in quoted if value in returned]
    if found:
        return True, f"quotes {found[0]:g}, which a tool returned"
    return False, f"quotes {quoted[0]:g}, which no tool of the round returned"


def _figures(text: str) -> list[float]:
    values = []
    for match in _FIGURE.findall(text):
        digits = match.replace(",", "")
        if sum(ch.isdigit() for ch in digits) >= 2:
            values.append(float(digits))
    return values


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]


def _tool_message(call: dict[str, Any], result: ToolExecutionResult) -> dict[str, Any]:
    """The ToolMessage carrier as a dict (what ``result.to_tool_message()`` holds)."""
    return {
        "role": "tool",
        "tool_call_id": result.tool_call_id,
        "name": call["name"],
        "content": result.format_error_observation(),
        "status": "success" if result.success else "error",
    }

