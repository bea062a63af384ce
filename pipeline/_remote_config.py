"""Pick up config changes made in the dashboard without restarting the agent.

``RemoteConfig`` polls ``GET {endpoint}/api/v1/config`` with ``If-None-Match``. A
payload is validated whole before it replaces the current one; when the dashboard is
unreachable or answers junk, the agent keeps the last good config (logged, counted).
``ConfigPayload`` is the JSON shape: the dashboard serves exactly this model.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._compression import ContextCompressionConfig
from ._exceptions import ConfigError
from ._delivery import MAX_RESPONSE_BYTES, Transport, UrllibTransport
from ._levels import OutputLevel
from ._models import ToolCachePolicy
from ._records import Identifier
from ._tokens import MAX_SAFETY_MARGIN, ModelFamily

logger = logging.getLogger("pipeline.remote_config")

MAX_TOOLS = 1_000
# A safety margin multiplies token counts: below 1 would undercount.
Margin = Annotated[float, Field(ge=1.0, le=MAX_SAFETY_MARGIN, allow_inf_nan=False)]


class ConfigPayload(BaseModel):
    """The body of ``GET /api/v1/config``.

    Unknown keys are ignored, so an agent keeps working when a newer dashboard adds
    a setting; every known key is validated.
    """

    model_config = ConfigDict(extra="ignore")

    revision: int = Field(default=0, ge=0)  # the dashboard's counter, for logs and display
    # Overrides for ContextCompressionConfig (merged onto the agent's own config).
    compression: dict[str, Any] = Field(default_factory=dict, max_length=64)
    tool_output_levels: dict[Identifier, OutputLevel] = Field(default_factory=dict, max_length=MAX_TOOLS)
    tool_cache_policies: dict[Identifier, ToolCachePolicy] = Field(default_factory=dict, max_length=MAX_TOOLS)
    encoder_margins: dict[ModelFamily, Margin] = Field(default_factory=dict, max_length=100)


@dataclass(frozen=True)
class EffectiveConfig:
    """A validated config the agent runs with."""

    revision: int = 0
    compression: Mapping[str, Any] = field(default_factory=dict)
    tool_output_levels: Mapping[str, OutputLevel] = field(default_factory=dict)
    tool_cache_policies: Mapping[str, ToolCachePolicy] = field(default_factory=dict)
    encoder_margins: Mapping[ModelFamily, float] = field(default_factory=dict)
    etag: Optional[str] = field(default=None, compare=False)

    @classmethod
    def from_payload(cls, payload: ConfigPayload, etag: Optional[str] = None) -> EffectiveConfig:
        _check_compression(payload.compression)
        return cls(
            revision=payload.revision,
            compression=dict(payload.compression),
            tool_output_levels=dict(payload.tool_output_levels),
            tool_cache_policies=dict(payload.tool_cache_policies),
            encoder_margins=dict(payload.encoder_margins),
            etag=etag,
        )


def _check_compression(overrides: Mapping[str, Any]) -> None:
    """Refuse compression overrides ContextCompressionConfig would refuse."""
    if overrides:
        ContextCompressionConfig.from_dict(dict(overrides))  # raises ConfigError naming the field


@dataclass
class RemoteConfigStats:
    polls: int = 0
    updates: int = 0
    not_modified: int = 0
    errors: int = 0  # unreachable, bad status, junk or invalid payload
    last_error: Optional[str] = None


class RemoteConfig:
    """Poll the dashboard's config; keep the last good one; tell ``on_change``."""

    def __init__(
        self,
        endpoint: str,
        api_key: str,
        *,
        interval_seconds: float = 30,
        transport: Optional[Transport] = None,
        on_change: Optional[Callable[[EffectiveConfig], Any]] = None,
        request_timeout_s: float = 5.0,
    ) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError("endpoint must be an http(s) URL")
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")
        self.url = f"{endpoint.rstrip('/')}/api/v1/config"
        self.interval_seconds = interval_seconds
        self.on_change = on_change
        self.request_timeout_s = request_timeout_s
        self._auth = f"Bearer {api_key}"
        self._transport: Transport = transport or UrllibTransport()
        self._lock = threading.Lock()
        self._current: Optional[EffectiveConfig] = None
        self._stats = RemoteConfigStats()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._warned: set[str] = set()

    def current(self) -> Optional[EffectiveConfig]:
        """The last good config, or None before the first one arrived."""
        with self._lock:
            return self._current

    def stats(self) -> RemoteConfigStats:
        with self._lock:
            return RemoteConfigStats(**vars(self._stats))

    def refresh_now(self) -> bool:
        """Fetch once. True when a new config replaced the current one; never raises."""
        with self._lock:
            self._stats.polls += 1
            etag = self._current.etag if self._current else None
        headers = {"Authorization": self._auth, "Accept": "application/json"}
        if etag:
            headers["If-None-Match"] = etag
        try:
            status, answer_headers, body = self._transport.send("GET", self.url, headers, b"", self.request_timeout_s)
        except Exception as exc:  # unreachable: keep what we have
            return self._failed("unreachable", f"{type(exc).__name__}: {str(exc)[:200]}")
        if status == 304:
            with self._lock:
                self._stats.not_modified += 1
            return False
        if status != 200:
            return self._failed(f"http-{status}", f"HTTP {status}")
        if len(body) >= MAX_RESPONSE_BYTES:
            return self._failed("too-big", "config payload too large")
        try:
            payload = ConfigPayload.model_validate_json(body)
            new = EffectiveConfig.from_payload(payload, _header(answer_headers, "etag"))
        except (ValidationError, ConfigError, ValueError) as exc:
            return self._failed("invalid", f"invalid config payload: {_first_error(exc)}")
        with self._lock:
            old = self._current
            self._current = new
            changed = new != old
            if changed:
                self._stats.updates += 1
            self._stats.last_error = None
        if changed and self.on_change is not None:
            try:
                self.on_change(new)
            except Exception:
                logger.exception("remote config on_change callback failed")
        return changed

    def start(self) -> None:
        """Poll in a daemon thread: once now, then every ``interval_seconds``."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pipeline-remote-config", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh_now()
            self._stop.wait(self.interval_seconds)

    def apply_to(
        self,
        executor: Any = None,
        context_manager: Any = None,
        token_counter: Any = None,
        config: Optional[EffectiveConfig] = None,
    ) -> bool:
        """Push a config (the current one by default) into running components.

        Duck-typed: ``executor.tool_levels`` / ``executor.tool_cache_policies`` dicts are
        updated; ``context_manager.config`` is rebuilt with the compression overrides
        merged onto it; ``token_counter.set_margin(family, margin)`` per family. Tools
        the dashboard does not mention keep the agent's own settings. Returns False
        when there was nothing to apply or a part was refused (logged).
        """
        config = config or self.current()
        if config is None:
            return False
        ok = True
        if executor is not None:
            for attribute, values in (
                ("tool_levels", config.tool_output_levels),
                ("tool_cache_policies", config.tool_cache_policies),
            ):
                target = getattr(executor, attribute, None)
                if isinstance(target, dict):
                    target.update(values)
                elif values:
                    logger.warning("executor has no %s dict; remote setting not applied", attribute)
                    ok = False
        if context_manager is not None and config.compression:
            ok = _apply_compression(context_manager, config.compression) and ok
        if token_counter is not None:
            # A DynamicTokenCounter keeps its margins in its registry.
            set_margin = getattr(token_counter, "set_margin", None) or getattr(
                getattr(token_counter, "registry", None), "set_margin", None
            )
            for family, margin in config.encoder_margins.items():
                try:
                    set_margin(family, margin)  # type: ignore[misc]
                except Exception as exc:
                    logger.warning("encoder margin for %s not applied: %s", family, exc)
                    ok = False
        return ok

    def _failed(self, key: str, message: str) -> bool:
        with self._lock:
            self._stats.errors += 1
            self._stats.last_error = message
        if key not in self._warned:  # one line per kind of trouble, not one per poll
            self._warned.add(key)
            logger.warning("remote config: %s; keeping the last good config", message)
        return False


def _apply_compression(context_manager: Any, overrides: Mapping[str, Any]) -> bool:
    current = getattr(context_manager, "config", None)
    if current is None or not hasattr(current, "to_dict") or not hasattr(type(current), "from_dict"):
        logger.warning("context manager has no config with to_dict/from_dict; compression not applied")
        return False
    try:
        context_manager.config = type(current).from_dict({**current.to_dict(), **overrides})
    except (ConfigError, ValueError, TypeError) as exc:
        logger.warning("compression overrides refused: %s", exc)
        return False
    return True


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    return next((v for k, v in headers.items() if k.lower() == name), None)


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "payload"
        return f"{where}: {first['msg']}"[:300]
    return str(exc)[:300]

