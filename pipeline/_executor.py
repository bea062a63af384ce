"""The tool executor: the seeds' PipelineToolWrapper and ``@pipeline_tool``.

One call goes: permission check (the active skill's allowed tools) → tool lookup →
output level → idempotency cache (``IdempotencyCache.lookup``: a hit at this level
answers the call) → run with timeout → retry transient failures with backoff and
growing timeouts → result (artifact store for large or FULL data) → token count →
``on_result`` callbacks (``hook_executor`` adds one that sends spans and records).
Callbacks get the renderings at the other levels as a ``LazyRenderings``: rendered
and counted only when read, which the hook does on its exporter thread, so a hooked
call costs the agent no more renderings or token counts than an unhooked one.

Every failure along the way becomes an error result in the standard error
observation: nothing propagates into the agent loop, not even a failing token
counter, artifact store, cache or callback (those degrade and are noted in
``result.warnings`` or the log).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Union, overload

from ._artifacts import resolve_storage
from ._errors import ToolErrorResponse, ToolErrorType, describe_exception
from ._exceptions import ConfigError, ToolTimeoutError
from ._levels import OutputLevel, _render, resolve_output_level, summarize_data
from ._priority import call_ended, call_started
from ._models import Payload, ToolCachePolicy, ToolExecutionResult, ToolInvocationRequest
from ._records import LevelRendering
from ._retry import ToolRetryPolicy
from ._timeout import InlineTimeoutHandler, ToolTimeoutHandler, get_timeout_handler

logger = logging.getLogger("pipeline.tools")

DEFAULT_MODEL = "claude-3-sonnet"
ResultCallback = Callable[[ToolInvocationRequest, ToolExecutionResult, Sequence[LevelRendering]], Any]
_LEVELS = (OutputLevel.BRIEF, OutputLevel.STANDARD, OutputLevel.FULL)


class LazyRenderings(Sequence[LevelRendering]):
    """A call's renderings at BRIEF, STANDARD and FULL, computed once, when first read
    (from any thread). ``on_result`` callbacks receive this instead of a list so the
    agent thread does not pay for renderings only an exporter will read."""

    __slots__ = ("_compute", "_items", "_lock")

    def __init__(self, compute: Callable[[], list[LevelRendering]]) -> None:
        self._compute: Optional[Callable[[], list[LevelRendering]]] = compute
        self._items: list[LevelRendering] = []
        self._lock = threading.Lock()

    def materialize(self) -> list[LevelRendering]:
        if self._compute is not None:
            with self._lock:
                if self._compute is not None:
                    self._items = self._compute()
                    self._compute = None
        return self._items

    @overload
    def __getitem__(self, index: int) -> LevelRendering: ...
    @overload
    def __getitem__(self, index: slice) -> list[LevelRendering]: ...
    def __getitem__(self, index: Any) -> Any:
        return self.materialize()[index]

    def __len__(self) -> int:
        return len(self.materialize())

    def __iter__(self) -> Iterator[LevelRendering]:
        return iter(self.materialize())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LazyRenderings, list)):
            return self.materialize() == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"LazyRenderings({self.materialize()!r})"


@dataclass(frozen=True)
class ToolSpec:
    """How a tool is registered: its name and the defaults its calls run with."""

    name: str
    func: Callable[..., Any]
    version: str = "1.0.0"
    default_level: Optional[OutputLevel] = None
    cache_policy: ToolCachePolicy = ToolCachePolicy.NO_CACHE
    timeout_ms: Optional[int] = None
    is_async: bool = False  # an ``async def`` tool: run to completion, never returned as a coroutine


def _is_async_callable(func: Any) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - an object with ``async def __call__``
    return call is not None and not inspect.isfunction(func) and inspect.iscoroutinefunction(call)


async def _awaited(awaitable: Any, timeout_s: float) -> Any:
    # Cancelled at the timeout, so the worker thread is freed rather than stuck.
    return await asyncio.wait_for(awaitable, timeout_s)


def _run_to_completion(awaitable: Any, timeout_ms: float) -> Any:
    """Run a coroutine (or other awaitable) on a loop of this worker thread's own."""
    try:
        return asyncio.run(_awaited(awaitable, timeout_ms / 1000.0))
    except asyncio.TimeoutError:
        raise ToolTimeoutError(f"Tool timed out after {timeout_ms:g}ms") from None


def _call_async_tool(func: Callable[..., Any], parameters: Mapping[str, Any], timeout_ms: float) -> Any:
    return _run_to_completion(func(**parameters), timeout_ms)


def _checked_spec(
    name: Any,
    func: Any,
    version: Any,
    default_level: Any,
    cache_policy: Any,
    timeout_ms: Any,
) -> ToolSpec:
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise ConfigError("name", "must be a non-empty string of at most 200 characters")
    if not callable(func):
        raise ConfigError("func", "must be callable")
    if not isinstance(version, str) or not version:
        raise ConfigError("version", "must be a non-empty string")
    if timeout_ms is not None and (
        isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0
    ):
        raise ConfigError("timeout_ms", "must be a positive integer or None")
    try:
        level = None if default_level is None else OutputLevel(default_level)
    except ValueError:
        raise ConfigError("default_level", f"not an output level: {default_level!r}") from None
    try:
        policy = ToolCachePolicy(cache_policy)
    except ValueError:
        raise ConfigError("cache_policy", f"not a cache policy: {cache_policy!r}") from None
    return ToolSpec(name, func, version, level, policy, timeout_ms, _is_async_callable(func))


def pipeline_tool(
    func: Optional[Callable[..., Any]] = None,
    *,
    name: Optional[str] = None,
    version: str = "1.0.0",
    default_level: Union[OutputLevel, str, None] = None,
    cache_policy: Union[ToolCachePolicy, str] = ToolCachePolicy.NO_CACHE,
    timeout_ms: Optional[int] = None,
    executor: Optional["ToolExecutor"] = None,
) -> Any:
    """Mark a plain ``def`` as a pipeline tool (``@pipeline_tool`` or
    ``@pipeline_tool(name=..., cache_policy=...)``).

    The function is returned unchanged (still directly callable) with its ToolSpec
    at ``func.pipeline_tool``; with ``executor`` it is registered there at once,
    otherwise register it later with ``executor.register_tool(func)``.
    """

    def decorate(target: Callable[..., Any]) -> Callable[..., Any]:
        spec = _checked_spec(
            name or getattr(target, "__name__", None),
            target,
            version,
            default_level,
            cache_policy,
            timeout_ms,
        )
        target.pipeline_tool = spec  # type: ignore[attr-defined]
        if executor is not None:
            executor.register_tool(target)
        return target

    return decorate(func) if func is not None else decorate


class ToolExecutor:
    """Runs registered tools for an agent and turns every outcome into a
    ToolExecutionResult. Safe to use from several threads at once.

    Tools are plain ``def`` functions (seeds v2.1); an ``async def`` tool is run to
    completion too: ``execute()`` runs it on the worker thread's own event loop,
    ``await aexecute()`` on the caller's loop. ``storage_dir`` on a request sends
    its large or FULL data to the store on that directory; ``conversation_id``
    ties stored artifacts to a conversation, and ``end_conversation`` removes them.
    """

    def __init__(
        self,
        *,
        token_counter: Any = None,
        artifact_store: Any = None,
        idempotency_cache: Any = None,
        retry_policy: Optional[ToolRetryPolicy] = None,
        sleep: Callable[[float], Any] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
        model: str = DEFAULT_MODEL,
        global_default_level: Union[OutputLevel, str] = OutputLevel.STANDARD,
        tool_levels: Optional[Mapping[str, Union[OutputLevel, str]]] = None,
        tool_cache_policies: Optional[Mapping[str, Union[ToolCachePolicy, str]]] = None,
        timeout_handler: Optional[Union[ToolTimeoutHandler, InlineTimeoutHandler]] = None,
        on_result: Optional[Iterable[ResultCallback]] = None,
        conversation_id: Optional[str] = None,
    ) -> None:
        if token_counter is None:
            from ._tokens import get_token_counter

            token_counter = get_token_counter()
        if idempotency_cache is None:
            from ._cache import IdempotencyCache

            idempotency_cache = IdempotencyCache()
        self.token_counter = token_counter
        self.artifact_store = resolve_storage(artifact_store)  # a directory path works too
        self.conversation_id = conversation_id
        self._stores_used: dict[int, Any] = {}  # stores of request storage_dirs, for end_conversation
        self.idempotency_cache = idempotency_cache
        self.retry_policy = retry_policy or ToolRetryPolicy()
        self.model = model
        self.global_default_level = OutputLevel(global_default_level)
        # Per-tool overrides (admin / remote config) win over registration defaults.
        self.tool_levels = {k: OutputLevel(v) for k, v in (tool_levels or {}).items()}
        self.tool_cache_policies = {
            k: ToolCachePolicy(v) for k, v in (tool_cache_policies or {}).items()
        }
        self.timeout_handler = timeout_handler or get_timeout_handler()
        self.on_result: list[ResultCallback] = list(on_result or [])
        self._sleep = sleep
        self._clock = clock
        self._tools: dict[str, ToolSpec] = {}
        self._register_lock = threading.Lock()

    # ------------------------------------------------------------------ registry

    def register(
        self,
        name: str,
        func: Callable[..., Any],
        *,
        version: str = "1.0.0",
        default_level: Union[OutputLevel, str, None] = None,
        cache_policy: Union[ToolCachePolicy, str] = ToolCachePolicy.NO_CACHE,
        timeout_ms: Optional[int] = None,
    ) -> Callable[..., Any]:
        """Register ``func`` under ``name``; it is called as ``func(**parameters)``.
        Raises ConfigError (naming the field) for a bad registration."""
        spec = _checked_spec(name, func, version, default_level, cache_policy, timeout_ms)
        self._add(spec)
        return func

    def register_tool(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Register a function decorated with ``@pipeline_tool``."""
        spec = getattr(func, "pipeline_tool", None)
        if not isinstance(spec, ToolSpec):
            raise ConfigError("func", "is not decorated with @pipeline_tool")
        self._add(spec)
        return func

    def _add(self, spec: ToolSpec) -> None:
        with self._register_lock:  # copy on write: execute() reads without a lock
            tools = dict(self._tools)
            tools[spec.name] = spec
            self._tools = tools

    @property
    def tool_names(self) -> list[str]:
        return sorted(self._tools)

    # ------------------------------------------------------------------ execution

    def execute(
        self,
        request: ToolInvocationRequest,
        *,
        context_usage: float = 0.0,
        context_modifier: Any = None,
        conversation_id: Optional[str] = None,
    ) -> ToolExecutionResult:
        """Run one tool call and return its result; never raises for tool failures.

        ``context_usage`` (0..1) is how full the context window is (above 0.8 the
        level drops to BRIEF unless the call or the tool says otherwise);
        ``context_modifier`` is the active skill's modifier: a non-None
        ``allowed_tools`` that lacks this tool denies the call without running it;
        ``conversation_id`` (default: the executor's) ties a stored artifact to
        the conversation. Only a request that is not a ToolInvocationRequest (a
        caller bug) raises, and KeyboardInterrupt / SystemExit from a tool
        propagate as themselves.
        """
        return self._execute(request, context_usage, context_modifier, False, conversation_id)[0]

    def execute_with_renderings(
        self,
        request: ToolInvocationRequest,
        *,
        context_usage: float = 0.0,
        context_modifier: Any = None,
        conversation_id: Optional[str] = None,
    ) -> tuple[ToolExecutionResult, list[LevelRendering]]:
        """execute(), plus the same data rendered at BRIEF, STANDARD and FULL with
        their token counts (for the dashboard's level comparison). No second
        artifact is written: FULL refers to the call's artifact when it has one.
        A failed call has no renderings; a cache hit only its own level's."""
        result, renderings = self._execute(request, context_usage, context_modifier, True, conversation_id)
        return result, list(renderings)

    async def aexecute(
        self,
        request: ToolInvocationRequest,
        *,
        context_usage: float = 0.0,
        context_modifier: Any = None,
        conversation_id: Optional[str] = None,
    ) -> ToolExecutionResult:
        """execute() for an asyncio agent. An ``async def`` tool is awaited on the
        running loop (so it may use the loop's clients), with the call's timeout
        and the retry policy; a ``def`` tool runs in a thread, so the loop never
        blocks on it."""
        if not isinstance(request, ToolInvocationRequest):
            raise TypeError("aexecute() takes a ToolInvocationRequest")
        spec = self._tools.get(request.tool_name)
        if spec is None or not spec.is_async:
            return await asyncio.get_running_loop().run_in_executor(
                None,
                functools.partial(
                    self.execute,
                    request,
                    context_usage=context_usage,
                    context_modifier=context_modifier,
                    conversation_id=conversation_id,
                ),
            )
        started = self._clock()
        try:
            prepared = self._prepare(request, context_usage, context_modifier, False, bool(self.on_result))
            if isinstance(prepared, _Call):
                outcome = await self._adrive(prepared)
                result, renderings = self._finish(prepared, outcome, False, bool(self.on_result), conversation_id)
            else:
                result, renderings = prepared
        except Exception as exc:
            logger.exception("tool executor failed on %s", request.tool_call_id)
            result, renderings = self._internal_error(request, exc), []
        return self._done(request, result, renderings, started)

    def end_conversation(self, conversation_id: Optional[str] = None) -> int:
        """The conversation ended (v2.1 "会话结束清理"): remove the artifacts it
        stored, in this executor's store and the stores of its requests'
        storage_dirs; returns how many were removed."""
        conversation_id = conversation_id or self.conversation_id
        if not conversation_id:
            raise ConfigError("conversation_id", "which conversation ended?")
        stores = {id(self.artifact_store): self.artifact_store} if self.artifact_store is not None else {}
        stores.update(self._stores_used)
        removed = 0
        for store in stores.values():
            cleanup = getattr(store, "cleanup_conversation", None)
            if callable(cleanup):
                removed += int(cleanup(conversation_id))
        return removed

    def _execute(
        self,
        request: ToolInvocationRequest,
        context_usage: float,
        context_modifier: Any,
        want_renderings: bool,
        conversation_id: Optional[str] = None,
    ) -> tuple[ToolExecutionResult, Sequence[LevelRendering]]:
        if not isinstance(request, ToolInvocationRequest):
            raise TypeError("execute() takes a ToolInvocationRequest")
        started = self._clock()
        lazy = bool(self.on_result)
        call_started()  # exporter threads defer to this call while it is short
        try:
            try:
                prepared = self._prepare(request, context_usage, context_modifier, want_renderings, lazy)
                if isinstance(prepared, _Call):
                    outcome = self._drive(prepared)
                    result, renderings = self._finish(prepared, outcome, want_renderings, lazy, conversation_id)
                else:
                    result, renderings = prepared
            except Exception as exc:  # a bug of ours must not reach the agent loop either
                logger.exception("tool executor failed on %s", request.tool_call_id)
                result, renderings = self._internal_error(request, exc), []
            return self._done(request, result, renderings, started), renderings
        finally:
            call_ended()

    def _done(
        self,
        request: ToolInvocationRequest,
        result: ToolExecutionResult,
        renderings: Sequence[LevelRendering],
        started: float,
    ) -> ToolExecutionResult:
        result.duration_ms = max(0.0, (self._clock() - started) * 1000.0)
        for callback in self.on_result:
            try:
                callback(request, result, renderings)
            except Exception:
                logger.exception("on_result callback %r failed", callback)
        return result

    def _internal_error(self, request: ToolInvocationRequest, exc: BaseException) -> ToolExecutionResult:
        return self._error(
            request, ToolErrorType.INTERNAL_ERROR, f"Tool executor error: {describe_exception(exc)}"
        )

    def _prepare(
        self,
        request: ToolInvocationRequest,
        context_usage: float,
        context_modifier: Any,
        want_renderings: bool,
        lazy_renderings: bool,
    ) -> Union["_Call", tuple[ToolExecutionResult, Sequence[LevelRendering]]]:
        """Everything before the tool runs: permission, lookup, level, storage, cache.
        Returns the call to make, or the answer when no tool needs to run."""
        name = request.tool_name
        if not _allowed(name, context_modifier):
            return self._error(
                request,
                ToolErrorType.PERMISSION_DENIED,
                f"Tool '{name}' is not allowed in the current context",
            ), []
        spec = self._tools.get(name)
        if spec is None:
            known = ", ".join(sorted(self._tools)[:20]) or "none"
            return self._error(
                request, ToolErrorType.NOT_FOUND, f"Unknown tool '{name}'. Available tools: {known}"
            ), []

        store = self.artifact_store
        if request.storage_dir is not None:
            try:  # checked before the tool runs: its output would have nowhere to go
                store = resolve_storage(request.storage_dir)
            except Exception as exc:
                return self._error(
                    request,
                    ToolErrorType.INVALID_PARAMETERS,
                    f"storage_dir cannot hold artifacts: {describe_exception(exc)}",
                ), []
            self._stores_used.setdefault(id(store), store)
        level = resolve_output_level(
            request.output_level,
            self.tool_levels.get(name, spec.default_level),
            context_usage,
            self.global_default_level,
        )
        policy = self._cache_policy(request, spec)
        key = None
        if policy is not ToolCachePolicy.NO_CACHE:
            key = request.get_or_generate_idempotency_key()
            hit = self._cached(key, request.tool_call_id, level)
            if hit is not None:
                own = functools.partial(_own_rendering, level, hit.observation, hit.observation_tokens)
                if want_renderings:
                    return hit, own()
                return hit, LazyRenderings(own) if lazy_renderings else []
        return _Call(request, spec, level, policy, key, store)

    def _finish(
        self,
        call: "_Call",
        outcome: Union[ToolExecutionResult, tuple[Payload, int, Optional[str]]],
        want_renderings: bool,
        lazy_renderings: bool,
        conversation_id: Optional[str],
    ) -> tuple[ToolExecutionResult, Sequence[LevelRendering]]:
        """Everything after the tool ran: the result (artifact when large or FULL),
        its token count, the renderings, the cache. Renderings eagerly when
        ``want_renderings``, as a LazyRenderings when only ``lazy_renderings``
        (callbacks), else none."""
        request, level = call.request, call.level
        if isinstance(outcome, ToolExecutionResult):
            outcome.observation_tokens = self._count(outcome.observation, outcome.warnings)
            return outcome, []
        payload, retries, last_error = outcome

        result = ToolExecutionResult.from_payload(
            request.tool_call_id,
            payload,
            level,
            call.store,
            conversation_id=conversation_id or self.conversation_id,
        )
        result.retry_count = retries
        result.last_error = last_error
        renderings: Sequence[LevelRendering] = []
        if want_renderings:
            renderings = self._renderings(payload, result, result.warnings)
            result.observation_tokens = next(r.tokens for r in renderings if r.level is level)
        else:
            result.observation_tokens = self._count(result.observation, result.warnings)
            if lazy_renderings:
                # Read later, maybe on another thread: their warnings must not touch
                # the result the agent already holds.
                renderings = LazyRenderings(functools.partial(self._renderings, payload, result, []))
        if call.key is not None:
            try:
                self.idempotency_cache.remember(call.key, result, call.policy)
            except Exception as exc:
                logger.warning("idempotency cache failed for %s: %s", request.tool_call_id, exc)
                result.warnings.append(f"cache_failed: {type(exc).__name__}")
        return result, renderings

    def _attempts(
        self, request: ToolInvocationRequest, spec: ToolSpec
    ) -> Iterator[tuple[bool, float]]:
        """The retry loop, written once for both drivers (``_drive``, ``_adrive``):
        a generator that yields ``(True, timeout_ms)`` to have the tool run (the
        driver sends its value or throws its exception in) and ``(False, delay_s)``
        to have the driver wait; it returns the encoded data with the retry count and
        last error, or the error result."""
        base_timeout = (
            spec.timeout_ms
            if spec.timeout_ms is not None and "timeout_ms" not in request.model_fields_set
            else request.timeout_ms
        )
        policy = self.retry_policy
        attempt = 0
        last_error: Optional[str] = None
        while True:
            timeout = base_timeout if attempt == 0 else policy.get_retry_timeout(base_timeout, attempt)
            try:
                raw = yield True, timeout
            except Exception as exc:
                error = ToolErrorResponse.from_exception(request.tool_call_id, exc)
                if isinstance(exc, ToolTimeoutError):
                    error.error_message = f"Tool execution timed out after {timeout}ms"
                last_error = f"{error.error_type.value}: {error.error_message}"
                retry = policy.should_retry(error.error_type, attempt) and (
                    error.error_type is not ToolErrorType.TIMEOUT or request.retry_on_timeout
                )
                if not retry:
                    return error.to_result(retry_count=attempt, last_error=last_error)
                logger.info("retrying %s after %s", request.tool_call_id, last_error)
                yield False, policy.get_delay(attempt) / 1000.0
                attempt += 1
            else:
                return Payload.of(raw), attempt, last_error

    def _drive(self, call: "_Call") -> Any:
        """Run the retry loop on this thread, each attempt on a worker with its timeout."""
        request, spec = call.request, call.spec
        tool_call_id = request.tool_call_id
        if spec.is_async:
            run = functools.partial(_call_async_tool, spec.func, request.parameters)
        else:
            run = None
            invoke = functools.partial(spec.func, **request.parameters)
        run_with_timeout = self.timeout_handler.execute_with_timeout
        # A coroutine runs to completion on a loop of its own, which the calling
        # thread may not start (it may run one): on a worker thread, even inline.
        run_awaitable = (
            get_timeout_handler().execute_with_timeout
            if isinstance(self.timeout_handler, InlineTimeoutHandler)
            else run_with_timeout
        )
        steps = self._attempts(request, spec)
        try:
            run_now, timeout = next(steps)
            while True:
                if not run_now:
                    self._sleep(timeout)  # the backoff delay, in seconds
                    run_now, timeout = steps.send(None)
                    continue
                try:
                    if run is None:
                        value = run_with_timeout(invoke, tool_call_id, timeout)
                        if inspect.isawaitable(value):  # a def that returned a coroutine
                            value = run_awaitable(
                                functools.partial(_run_to_completion, value, timeout), tool_call_id, timeout
                            )
                    else:
                        value = run_awaitable(functools.partial(run, timeout), tool_call_id, timeout)
                except Exception as exc:
                    run_now, timeout = steps.throw(exc)
                else:
                    run_now, timeout = steps.send(value)
        except StopIteration as stop:
            return stop.value

    async def _adrive(self, call: "_Call") -> Any:
        """The retry loop on the running event loop, for an ``async def`` tool."""
        request, spec = call.request, call.spec
        steps = self._attempts(request, spec)
        try:
            run_now, timeout = next(steps)
            while True:
                if not run_now:
                    await asyncio.sleep(timeout)  # the backoff delay, in seconds
                    run_now, timeout = steps.send(None)
                    continue
                try:
                    try:
                        value = await asyncio.wait_for(spec.func(**request.parameters), timeout / 1000.0)
                    except asyncio.TimeoutError:
                        raise ToolTimeoutError(f"Tool timed out after {timeout:g}ms") from None
                except Exception as exc:
                    run_now, timeout = steps.throw(exc)
                else:
                    run_now, timeout = steps.send(value)
        except StopIteration as stop:
            return stop.value

    # ------------------------------------------------------------------ helpers

    def _cache_policy(self, request: ToolInvocationRequest, spec: ToolSpec) -> ToolCachePolicy:
        # A policy the caller set on the request wins; else config, else registration.
        if "cache_policy" in request.model_fields_set:
            return request.cache_policy
        return self.tool_cache_policies.get(spec.name, spec.cache_policy)

    def _cached(self, key: str, tool_call_id: str, level: OutputLevel) -> Optional[ToolExecutionResult]:
        """The cache hit answering this call (a miss at another level gets replaced);
        a failing cache is a miss, not a failed call."""
        try:
            hit = self.idempotency_cache.lookup(key, tool_call_id, level)
        except Exception as exc:
            logger.warning("idempotency cache lookup failed: %s", exc)
            return None
        return hit if isinstance(hit, ToolExecutionResult) else None

    def _count(self, text: str, warnings: list[str]) -> int:
        try:
            return int(self.token_counter.count_tokens(text, self.model))
        except Exception as exc:  # degrade to an estimate; never fail the call for it
            logger.warning("token counter failed: %s", exc)
            if not any(w.startswith("token_count_estimated") for w in warnings):
                warnings.append(f"token_count_estimated: {type(exc).__name__}")
            return len(text) // 4 + 1

    def _renderings(
        self, payload: Payload, result: ToolExecutionResult, warnings: list[str]
    ) -> list[LevelRendering]:
        """The data at each level, reusing this call's artifact (never storing another).
        The result's own level reuses its observation (and its token count once made)."""
        artifact_id = result.artifact_id
        # Data that went to the store because of its size would go there at any level.
        by_size = artifact_id is not None and result.output_level is not OutputLevel.FULL
        summary = result.data_summary or (summarize_data(payload.raw) if artifact_id else None)
        renderings = []
        for level in _LEVELS:
            if level is result.output_level:
                text = result.observation
                if result.observation_tokens:
                    renderings.append(_own_rendering(level, text, result.observation_tokens)[0])
                    continue
            elif artifact_id and (level is OutputLevel.FULL or by_size):
                text = _render(payload.raw, OutputLevel.FULL, artifact_id, summary, None)
            else:
                text = _render(payload.raw, level, None, None, payload.full_json)
            renderings.append(LevelRendering(level=level, observation=text, tokens=self._count(text, warnings)))
        return renderings

    def _error(
        self, request: ToolInvocationRequest, error_type: ToolErrorType, message: str
    ) -> ToolExecutionResult:
        result = ToolErrorResponse(
            tool_call_id=request.tool_call_id,
            error_type=error_type,
            error_code=error_type.default_code,
            error_message=message,
        ).to_result()
        result.observation_tokens = self._count(result.observation, result.warnings)
        return result


@dataclass(frozen=True)
class _Call:
    """A call ready to run: what _prepare found and _finish needs."""

    request: ToolInvocationRequest
    spec: ToolSpec
    level: OutputLevel
    policy: ToolCachePolicy
    key: Optional[str]
    store: Any


def _own_rendering(level: OutputLevel, observation: str, tokens: int) -> list[LevelRendering]:
    return [LevelRendering(level=level, observation=observation, tokens=tokens)]


def _allowed(tool_name: str, context_modifier: Any) -> bool:
    """Duck-typed check of a skill's ContextModifier (or a dict with allowed_tools)."""
    if context_modifier is None:
        return True
    if isinstance(context_modifier, Mapping):
        allowed = context_modifier.get("allowed_tools")
    else:
        allowed = getattr(context_modifier, "allowed_tools", None)
    if allowed is None:
        return True
    if isinstance(allowed, str):  # one name, not a collection of characters
        return tool_name == allowed
    if not isinstance(allowed, Collection):
        return False  # junk restriction: deny rather than guess
    return tool_name in allowed


def render_levels(
    raw_data: Any,
    counter: Any,
    model: str = DEFAULT_MODEL,
    *,
    artifact_id: Optional[str] = None,
    data_summary: Optional[str] = None,
) -> list[LevelRendering]:
    """Raw data rendered at BRIEF, STANDARD and FULL with token counts (FULL as the
    artifact reference when ``artifact_id`` is given). Encodes the data once."""
    payload = Payload.of(raw_data)
    renderings = []
    for level in _LEVELS:
        text = _render(
            payload.raw,
            level,
            artifact_id,
            data_summary or (summarize_data(raw_data) if artifact_id else None),
            payload.full_json,
        )
        renderings.append(
            LevelRendering(level=level, observation=text, tokens=int(counter.count_tokens(text, model)))
        )
    return renderings


#: The seeds' name (v2.1 roadmap "PipelineToolWrapper（LangChain 集成）", no signature
#: given): the executor is that wrapper.
PipelineToolWrapper = ToolExecutor
