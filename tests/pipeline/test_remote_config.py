"""RemoteConfig against a real config endpoint on 127.0.0.1: ETag / 304, keeping the
last good config through outages and junk, and applying it to real components."""

from __future__ import annotations

import hashlib
import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Iterator, Optional

import pytest

from pipeline import ConfigPayload, EffectiveConfig, OutputLevel, RemoteConfig, ToolCachePolicy
from pipeline._compression import AdvancedContextManager, ContextCompressionConfig
from pipeline._tokens import ModelEncoderRegistry, ModelFamily
from tests.pipeline.delivery_helpers import LocalServer, free_port

API_KEY = "cfg-key"

GOOD = {
    "revision": 3,
    "compression": {"strategy": "truncate", "threshold_ratio": 0.9, "target_ratio": 0.4},
    "tool_output_levels": {"query_sales": "brief", "export_report": "full"},
    "tool_cache_policies": {"query_sales": "ttl_short"},
    "encoder_margins": {"claude": 1.3},
}


class ConfigServer(LocalServer):
    def __init__(self) -> None:
        self.body: bytes = json.dumps(GOOD).encode()
        self.mode = "ok"  # "ok", "drop", "500", "junk"
        self.seen_etags: list[Optional[str]] = []
        super().__init__()

    def serve(self, payload: Any) -> None:
        self.body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        assert handler.path == "/api/v1/config"
        self.seen_etags.append(handler.headers.get("If-None-Match"))
        if handler.headers.get("Authorization") != f"Bearer {API_KEY}":
            return self.send(handler, 401, b'{"detail": "bad key"}')
        if self.mode == "drop":
            return None
        if self.mode == "500":
            return self.send(handler, 500, b"oops")
        etag = '"' + hashlib.sha256(self.body).hexdigest()[:16] + '"'
        if handler.headers.get("If-None-Match") == etag:
            return self.send(handler, 304, b"", etag)
        self.send(handler, 200, self.body, etag)

    def send(self, handler: BaseHTTPRequestHandler, status: int, body: bytes, etag: Optional[str] = None) -> None:
        self.reply(handler, status, body, "application/json", {"ETag": etag} if etag else None)


@pytest.fixture
def server() -> Iterator[ConfigServer]:
    s = ConfigServer()
    yield s
    s.close()


def client(server: ConfigServer, **options: Any) -> RemoteConfig:
    return RemoteConfig(server.url, API_KEY, **options)


def test_it_fetches_then_gets_304_with_the_etag(server: ConfigServer) -> None:
    remote = client(server)
    assert remote.current() is None
    assert remote.refresh_now() is True
    config = remote.current()
    assert config is not None and config.revision == 3
    assert config.tool_output_levels == {"query_sales": OutputLevel.BRIEF, "export_report": OutputLevel.FULL}
    assert config.tool_cache_policies == {"query_sales": ToolCachePolicy.TTL_SHORT}
    assert config.encoder_margins == {ModelFamily.CLAUDE: 1.3}
    assert config.compression["strategy"] == "truncate"

    assert remote.refresh_now() is False
    assert server.seen_etags == [None, config.etag]
    assert remote.current() is config
    stats = remote.stats()
    assert (stats.polls, stats.updates, stats.not_modified, stats.errors) == (2, 1, 1, 0)


def test_it_calls_on_change_only_when_the_config_changes(server: ConfigServer) -> None:
    changes: list[EffectiveConfig] = []
    remote = client(server, on_change=changes.append)
    remote.refresh_now()
    remote.refresh_now()
    server.serve({**GOOD, "revision": 4, "tool_output_levels": {"query_sales": "full"}})
    assert remote.refresh_now() is True
    assert [c.revision for c in changes] == [3, 4]
    assert changes[-1].tool_output_levels == {"query_sales": OutputLevel.FULL}


def test_it_survives_a_failing_on_change_callback(server: ConfigServer) -> None:
    def explode(config: EffectiveConfig) -> None:
        raise RuntimeError("agent bug")

    remote = client(server, on_change=explode)
    assert remote.refresh_now() is True
    assert remote.current() is not None


@pytest.mark.parametrize("mode", ["drop", "500"])
def test_it_keeps_the_last_good_config_when_the_dashboard_fails(server: ConfigServer, mode: str) -> None:
    remote = client(server)
    remote.refresh_now()
    good = remote.current()
    server.mode = mode
    assert remote.refresh_now() is False
    assert remote.current() is good
    assert remote.stats().errors == 1 and remote.stats().last_error


def test_it_keeps_the_last_good_config_when_nothing_listens(server: ConfigServer) -> None:
    remote = client(server)
    remote.refresh_now()
    good = remote.current()
    remote.url = f"http://127.0.0.1:{free_port()}/api/v1/config"
    assert remote.refresh_now() is False
    assert remote.current() is good
    assert "Error" in (remote.stats().last_error or "")


def test_it_counts_an_unauthorised_key_as_an_error(server: ConfigServer) -> None:
    remote = RemoteConfig(server.url, "wrong")
    assert remote.refresh_now() is False
    assert remote.current() is None and "401" in (remote.stats().last_error or "")


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"\xff\xfe\x00",
        b"[]",
        b"null",
        {**GOOD, "tool_output_levels": {"query_sales": "loud"}},
        {**GOOD, "tool_cache_policies": {"query_sales": "forever"}},
        {**GOOD, "encoder_margins": {"claude": 0.5}},
        {**GOOD, "encoder_margins": {"claude": 11}},
        {**GOOD, "encoder_margins": {"unknown-family": 1.2}},
        b'{"encoder_margins": {"claude": Infinity}}',
        b'{"encoder_margins": {"claude": NaN}}',
        {**GOOD, "tool_output_levels": {"bad\ntool": "brief"}},
        {**GOOD, "tool_output_levels": {f"tool_{i}": "brief" for i in range(1_001)}},
        {**GOOD, "compression": {"threshold_ratio": 5}},
        {**GOOD, "compression": {"no_such_setting": 1}},
        {**GOOD, "compression": ["truncate"]},
        {**GOOD, "revision": -1},
    ],
)
def test_it_keeps_the_last_good_config_when_the_payload_is_invalid(server: ConfigServer, payload: Any) -> None:
    remote = client(server)
    remote.refresh_now()
    good = remote.current()
    server.serve(payload)
    assert remote.refresh_now() is False
    assert remote.current() is good
    assert remote.stats().errors == 1
    # The invalid payload's ETag is not adopted: the next poll still asks with the good one.
    remote.refresh_now()
    assert server.seen_etags[-1] == good.etag  # type: ignore[union-attr]


def test_it_refuses_an_oversized_payload(server: ConfigServer) -> None:
    server.serve({**GOOD, "compression": {"strategy": "x" * (2 << 20)}})
    remote = client(server)
    assert remote.refresh_now() is False
    assert "too large" in (remote.stats().last_error or "")


def test_it_ignores_keys_a_newer_dashboard_adds(server: ConfigServer) -> None:
    server.serve({**GOOD, "feature_from_the_future": {"x": 1}})
    remote = client(server)
    assert remote.refresh_now() is True


def test_it_applies_the_config_to_real_components(server: ConfigServer) -> None:
    from pipeline._executor import ToolExecutor

    registry = ModelEncoderRegistry.create()
    executor = ToolExecutor(tool_levels={"other_tool": "full"})
    manager = AdvancedContextManager(ContextCompressionConfig(max_tokens=50_000, keep_recent=4))
    remote = client(server)
    assert remote.apply_to(executor=executor) is False  # nothing fetched yet
    remote.refresh_now()
    assert remote.apply_to(executor=executor, context_manager=manager, token_counter=registry) is True

    assert executor.tool_levels == {
        "other_tool": OutputLevel.FULL,
        "query_sales": OutputLevel.BRIEF,
        "export_report": OutputLevel.FULL,
    }
    assert executor.tool_cache_policies["query_sales"] is ToolCachePolicy.TTL_SHORT
    assert manager.config.strategy.value == "truncate" and manager.config.threshold_ratio == 0.9
    assert manager.config.max_tokens == 50_000 and manager.config.keep_recent == 4  # the agent's own settings stay
    assert registry.get_margin("claude") == 1.3


def test_it_reports_a_part_it_could_not_apply(server: ConfigServer) -> None:
    class NoDicts:
        pass

    class ContextManagerWithTightTarget:
        config = ContextCompressionConfig(target_ratio=0.7, threshold_ratio=0.9)

    remote = client(server)
    server.serve({"tool_output_levels": {"t": "brief"}, "compression": {"threshold_ratio": 0.2, "target_ratio": 0.1}})
    remote.refresh_now()
    assert remote.apply_to(executor=NoDicts()) is False
    manager = ContextManagerWithTightTarget()
    before = manager.config
    server.serve({"compression": {"threshold_ratio": 0.6}})  # valid with defaults, not with target_ratio 0.7
    assert remote.refresh_now() is True
    assert remote.apply_to(context_manager=manager) is False
    assert manager.config is before


def test_it_polls_in_a_background_thread_until_stopped(server: ConfigServer) -> None:
    changes: list[int] = []
    remote = client(server, interval_seconds=0.02, on_change=lambda c: changes.append(c.revision))
    remote.start()
    try:
        deadline = time.monotonic() + 5
        while not changes and time.monotonic() < deadline:
            time.sleep(0.01)
        server.serve({**GOOD, "revision": 9})
        while changes[-1:] != [9] and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        remote.stop()
    assert changes == [3, 9]
    polls = remote.stats().polls
    time.sleep(0.1)
    assert remote.stats().polls == polls  # stopped means stopped


def test_it_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError):
        RemoteConfig("ftp://dash", API_KEY)
    with pytest.raises(ValueError):
        RemoteConfig("http://127.0.0.1:1", API_KEY, interval_seconds=0)


def test_it_round_trips_the_payload_model_the_dashboard_serves() -> None:
    payload = ConfigPayload.model_validate(GOOD)
    again = ConfigPayload.model_validate_json(payload.model_dump_json())
    assert again == payload
    schema = ConfigPayload.model_json_schema()
    assert set(schema["properties"]) == {
        "revision",
        "compression",
        "tool_output_levels",
        "tool_cache_policies",
        "encoder_margins",
    }
