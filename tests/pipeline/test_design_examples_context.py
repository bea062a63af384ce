"""Every context-side form the design documents show, called as they write it:
token counting, context compression and its managers, the conversation model,
skills and message injection (v2.1 first; v2.0 where v2.1 did not rename or drop it).
docs/design-conformance.md lists each one.

The LLM is the only fake here (``FakeListChatModel``, named so in each test); the
token counter, the compression, the skills folder and the LangGraph graph with its
checkpointer are real. Forms that touch the process-wide token counter or the
working directory (config discovery) run in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from pipeline import (
    AdvancedContextManager,
    BasicContextManager,
    CompressionCostEstimate,
    CompressionMode,
    CompressionResult,
    ContextCompressionConfig,
    ContextCompressionStrategy,
    ContextModifier,
    ConversationRound,
    DynamicTokenCounter,
    EncoderConfig,
    LLMCompressor,
    LockManager,
    MessageImportance,
    MessageInjectionProtocol,
    MessagePriority,
    MessageWrapper,
    ModelEncoderRegistry,
    ModelFamily,
    MultiRoundConversation,
    SkillActivationRequest,
    SkillActivationResult,
    SkillActivationStack,
    SkillLoader,
    SkillMessage,
    ThreadSafeContextManager,
    ToolInvocationRequest,
    count_conversation_tokens,
    count_message_tokens,
    count_tokens,
    get_lock_manager,
    get_token_counter,
)

ROOT = Path(__file__).resolve().parents[2]
SKILLS = Path(__file__).parent / "skills_fixtures"


def run_as_written(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter in ``cwd`` (process-wide state, discovery)."""
    import os

    environ = {k: v for k, v in os.environ.items() if k != "PIPELINE_TOKEN_ENCODERS"}
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(env or {})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def conversation_messages(rounds: int = 12) -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("You are BA-Agent, a business analyst.")]
    for r in range(rounds):
        messages.append(HumanMessage(f"Question {r}: " + "what were sales by region last month? " * 8))
        messages.append(AIMessage("", tool_calls=[{"id": f"call_{r}", "name": "query_database", "args": {"q": r}}]))
        messages.append(ToolMessage(f"| region {r} | 100 |\n" * 40, tool_call_id=f"call_{r}"))
        messages.append(AIMessage(f"Answer {r}: " + "revenue grew steadily in the north. " * 8))
    return messages


# ============================================================== token counting (v2.1, v2.0)


def test_it_counts_the_v2_1_token_counter_calls_as_written():
    counter = get_token_counter()
    assert isinstance(counter, DynamicTokenCounter)
    # "Claude: cl100k_base + 15% margin", "GPT-4/3.5: cl100k_base（精确）", Gemini +20%, GLM +25%
    raw = len(counter._registry.get_encoder("gpt-4").encode("Hello, world!"))
    assert raw == 4
    assert counter.count_tokens("Hello, world!", model="gpt-4o") == 4
    assert counter.count_tokens("Hello, world!", model="claude-3-5-sonnet-20241022") == 5  # ceil(4 * 1.15)
    assert counter.count_tokens("Hello, world!", model="gemini-2.0-flash-exp") == 5  # ceil(4 * 1.2)
    assert counter.count_tokens("Hello, world!", "glm-4-plus") == 5  # ceil(4 * 1.25)
    assert counter.count_tokens("Hello, world!") == 5  # default model "claude-3-sonnet"
    assert count_tokens("Hello, world!") == 5
    assert count_tokens("Hello, world!", model="gpt-4o") == 4

    message = {"role": "user", "content": "Hello, world!"}
    assert counter.count_message_tokens(message, "gpt-4o") == count_message_tokens(message, "gpt-4o") > 4
    assert counter.count_conversation_tokens([message, message], "gpt-4o") == 2 * count_message_tokens(message, "gpt-4o")
    assert count_conversation_tokens([message, message], model="gpt-4o") == 2 * count_message_tokens(message, model="gpt-4o")


def test_it_counts_the_v2_0_content_blocks():
    counter = get_token_counter()
    blocks = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "thinking", "thinking": "The orders table has the data."},
            {"type": "tool_use", "id": "toolu_1", "name": "query_database", "input": {"sql": "select 1"}},
        ],
    }
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 row"}]}
    base = counter.count_message_tokens(blocks, "gpt-4o")
    bigger = dict(blocks, content=blocks["content"][:2] + [dict(blocks["content"][2], input={"sql": "select 1 " * 50})])
    assert counter.count_message_tokens(bigger, "gpt-4o") > base > counter.count_tokens("Let me look.", "gpt-4o")
    assert count_conversation_tokens([blocks, result], "gpt-4o") == base + count_message_tokens(result, "gpt-4o")
    config = counter._registry.get_encoder_config("gpt-4o")
    assert counter._count_tokens_exact("hi", "gpt-4o", config) is None  # no API client configured


def test_it_runs_the_v2_1_count_tokens_body_on_the_registry():
    # DynamicTokenCounter.count_tokens as v2.1 writes it, against our registry.
    counter = DynamicTokenCounter()
    config = counter._registry.get_encoder_config("claude-3-sonnet")
    encoder = counter._registry.get_encoder("claude-3-sonnet")
    estimated = len(encoder.encode("Hello, world!"))
    assert int(estimated * config.safety_margin) == 4
    assert config.safety_margin == 1.15


def test_it_gives_the_documented_model_info():
    info = get_token_counter().get_model_info("glm-4-plus")
    assert info == {
        "model": "glm-4-plus",
        "model_family": "glm",
        "encoding_name": "cl100k_base",
        "safety_margin": 1.25,
        "use_exact_counting": False,
        "has_api_client": False,
    }


def test_it_shares_one_registry_between_the_documented_constructors():
    registry = ModelEncoderRegistry()
    assert registry is ModelEncoderRegistry()  # the v2.0 singleton
    assert get_token_counter()._registry is registry
    assert DynamicTokenCounter()._registry is registry  # registry or ModelEncoderRegistry()
    assert DynamicTokenCounter(registry=registry)._registry is registry


def test_it_detects_families_and_matches_patterns_as_documented():
    registry = ModelEncoderRegistry()
    assert registry.detect_model_family("claude-3-opus") == ModelFamily.CLAUDE
    assert registry.detect_model_family("gpt-35-turbo") == ModelFamily.GPT
    assert registry.detect_model_family("qwen-2.5-72b") == ModelFamily.QWEN
    assert registry.detect_model_family("mixtral-8x7b") == ModelFamily.MISTRAL
    assert registry.detect_model_family("deepseek-v3") == ModelFamily.DEEPSEEK
    assert registry.detect_model_family("totally-unknown") == ModelFamily.CUSTOM
    assert registry._match_pattern("claude-3-sonnet", "claude-*")
    assert registry._match_pattern("gpt-4o", "gpt-4*")
    assert not registry._match_pattern("gpt-4o", "gpt-4")
    assert ModelFamily("mistal") is ModelFamily.MISTRAL  # the documents' spelling still reads


def test_it_builds_encoder_configs_as_documented():
    config = EncoderConfig(
        model_family=ModelFamily.CLAUDE,
        encoding_name="cl100k_base",
        safety_margin=1.15,  # 15% margin for Claude tokenizer
        use_exact_counting=False,
    )
    assert config.encoder_params == {}
    assert config.exact_counting_api is None
    data = config.to_dict()
    assert {k: data[k] for k in ("model_family", "encoding_name", "safety_margin", "use_exact_counting", "exact_counting_api", "encoder_params")} == {
        "model_family": "claude",
        "encoding_name": "cl100k_base",
        "safety_margin": 1.15,
        "use_exact_counting": False,
        "exact_counting_api": None,
        "encoder_params": {},
    }
    assert EncoderConfig.from_dict(data) == config
    assert EncoderConfig.from_dict({"model_family": "gpt", "encoding_name": "cl100k_base"}).model_family is ModelFamily.GPT
    assert config.validate() is True
    with pytest.raises(ValueError):
        EncoderConfig(model_family=ModelFamily.GPT, encoding_name="cl100k_base", safety_margin=0.9).validate()
    # the positional form of the dataclass
    assert EncoderConfig(ModelFamily.GLM, "cl100k_base", 1.25).safety_margin == 1.25


def test_it_registers_configs_and_custom_encoders_as_documented():
    class MyCustomEncoder:  # a TokenEncoder: encode / decode / count_tokens
        def encode(self, text):
            return list(range(len(text.split())))

        def decode(self, tokens):
            return " ".join("w" for _ in tokens)

        def count_tokens(self, text):
            return len(self.encode(text))

    registry = ModelEncoderRegistry(load_defaults=True)  # a private registry: leaves the shared one alone
    registry.register_custom_encoder(
        model_pattern="my-model-*",
        encoder=MyCustomEncoder(),
        config=EncoderConfig(model_family=ModelFamily.CUSTOM, encoding_name="my_encoding", safety_margin=1.0),
    )
    counter = DynamicTokenCounter(registry)
    assert counter.count_tokens("one two three four", model="my-model-7b") == 4
    registry.register_encoder_config(
        model_pattern="acme-*",
        config=EncoderConfig(model_family=ModelFamily.CUSTOM, encoding_name="cl100k_base", safety_margin=2.0),
    )
    assert counter.count_tokens("Hello, world!", model="acme-large") == 8
    assert counter.get_model_info("acme-large")["safety_margin"] == 2.0


def test_it_configures_an_api_client_for_exact_counting_as_documented():
    registry = ModelEncoderRegistry(load_defaults=True)
    registry.register_encoder_config(
        model_pattern="claude-*",
        config=EncoderConfig(model_family=ModelFamily.CLAUDE, encoding_name="cl100k_base", safety_margin=1.15, use_exact_counting=True),
    )
    counter = DynamicTokenCounter(registry)

    class ProviderClient:  # a fake of the provider's counting API (a network edge)
        def count_tokens(self, text, model):
            return 42

    counter.configure_api_client(ModelFamily.CLAUDE, ProviderClient(), api_key="sk-test")
    assert counter.get_model_info("claude-3-opus")["has_api_client"] is True
    assert counter.count_tokens("Hello, world!", model="claude-3-opus") == 42


DOCUMENTED_YAML = """\
encoders:
  claude-3-sonnet:
    model_family: claude
    encoding_name: cl100k_base
    safety_margin: 1.15
    use_exact_counting: false

  gpt-4o:
    model_family: gpt
    encoding_name: cl100k_base
    safety_margin: 1.0
    use_exact_counting: false

  # 自定义模型
  my-custom-model:
    model_family: custom
    encoding_name: my_custom_encoding
    safety_margin: 1.3
    use_exact_counting: true
    exact_counting_api: "https://my-api.com/count-tokens"
"""


def test_it_discovers_config_token_encoders_yaml_in_the_working_directory(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "token_encoders.yaml").write_text(DOCUMENTED_YAML, encoding="utf-8")
    out = run_as_written(
        """
        import json
        from pipeline import ModelEncoderRegistry, get_token_counter
        counter = get_token_counter()
        info = counter.get_model_info("my-custom-model")
        config = ModelEncoderRegistry().get_encoder_config("my-custom-model")
        print(json.dumps([info, config.exact_counting_api, counter.count_tokens("Hello, world!", "my-custom-model"),
                          counter.count_tokens("Hello, world!", "gpt-4o")]))
        """,
        tmp_path,
    )
    info, api, custom, gpt = json.loads(out)
    assert info["model_family"] == "custom" and info["safety_margin"] == 1.3 and info["use_exact_counting"] is True
    assert api == "https://my-api.com/count-tokens"
    assert custom == 6  # no such encoding: cl100k_base (4 tokens) with the entry's 1.3 margin, rounded up
    assert gpt == 4


def test_it_prefers_the_environment_variable_then_config_yml(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "token_encoders.yml").write_text(
        "encoders:\n  acme-1:\n    model_family: custom\n    encoding_name: cl100k_base\n    safety_margin: 2.0\n", encoding="utf-8"
    )
    env_file = tmp_path / "mine.yaml"
    env_file.write_text("encoders:\n  acme-1:\n    model_family: custom\n    encoding_name: cl100k_base\n    safety_margin: 3.0\n")
    code = "from pipeline import count_tokens; print(count_tokens('Hello, world!', 'acme-1'))"
    assert run_as_written(code, tmp_path).strip() == "8"
    assert run_as_written(code, tmp_path, {"PIPELINE_TOKEN_ENCODERS": str(env_file)}).strip() == "12"


# ============================================================== compression (v2.1)


class ConversationStore:
    """The BAAgent's store in the v2.1 integration example (in memory)."""

    def __init__(self, messages):
        self._messages = {"conv-1": list(messages)}

    def get_messages(self, conversation_id):
        return self._messages[conversation_id]

    def update_messages(self, conversation_id, messages):
        self._messages[conversation_id] = messages


class BAAgent:
    """The v2.1 integration example, as written, around a fake chat model."""

    def __init__(self, llm, max_tokens=6000):
        self.llm = llm
        self.max_tokens = max_tokens
        self.token_counter = get_token_counter()
        self.conversation_store = ConversationStore(conversation_messages())
        # 在 BAAgent.__init__ 中
        self.context_manager = AdvancedContextManager(
            max_tokens=self.max_tokens,
            compression_mode=CompressionMode.EXTRACT,
            llm_summarizer=self.llm,
            token_counter=self.token_counter,
        )

    def _compact_conversation(self, conversation_id: str, keep_recent: int = 10, mode=CompressionMode.EXTRACT):
        all_messages = self.conversation_store.get_messages(conversation_id)
        target_tokens = int(self.max_tokens * 0.5)
        compressed_messages = self.context_manager.compress(
            all_messages,
            target_tokens=target_tokens,
            mode=mode,
        )
        self.conversation_store.update_messages(conversation_id, compressed_messages)


def test_it_runs_the_v2_1_baagent_integration_as_written():
    agent = BAAgent(FakeListChatModel(responses=["unused"]))  # fake LLM: the edge
    before = agent.conversation_store.get_messages("conv-1")
    agent._compact_conversation("conv-1")
    stored = agent.conversation_store.get_messages("conv-1")
    assert isinstance(stored, list) and all(isinstance(m, BaseMessage) for m in stored)
    assert len(stored) < len(before)
    assert isinstance(stored[0], SystemMessage)  # CRITICAL: always kept
    assert agent.token_counter.count_conversation_tokens(stored, "claude-3-sonnet") <= 3000
    # the richer result stays reachable on the list
    assert isinstance(stored.result, CompressionResult)
    assert stored.result.mode is CompressionMode.EXTRACT and stored.result.target_met
    # and the tuple form of the library
    messages, result = agent.context_manager.compress_with_result(before, target_tokens=3000)
    assert messages == list(stored) and result.tokens_after == stored.result.tokens_after


def test_it_summarises_with_a_langchain_chat_model_given_as_llm_summarizer():
    llm = FakeListChatModel(responses=["The user asked for regional sales; the north grew."])  # fake LLM
    agent = BAAgent(llm)
    agent._compact_conversation("conv-1", mode=CompressionMode.SUMMARIZE)
    stored = agent.conversation_store.get_messages("conv-1")
    assert stored.result.mode is CompressionMode.SUMMARIZE, stored.result.fallback_reason
    summary = [m for m in stored if isinstance(m, SystemMessage) and "summary" in m.content.lower()]
    assert summary and "the north grew" in summary[0].content


def test_it_falls_back_and_never_raises_when_the_chat_model_fails():
    class BrokenChatModel(FakeListChatModel):  # fake LLM whose provider is down
        def invoke(self, *args, **kwargs):
            raise ConnectionError("provider down")

    agent = BAAgent(BrokenChatModel(responses=["x"]))
    agent._compact_conversation("conv-1", mode=CompressionMode.SUMMARIZE)
    stored = agent.conversation_store.get_messages("conv-1")
    assert stored.result.requested_mode is CompressionMode.SUMMARIZE
    assert stored.result.mode is CompressionMode.EXTRACT
    assert "ConnectionError" in stored.result.fallback_reason


def test_it_keeps_the_documented_enums():
    assert [m.value for m in CompressionMode] == ["truncate", "extract", "summarize"]
    assert [p.value for p in MessagePriority] == ["critical", "high", "medium", "low"]
    assert [s.value for s in ContextCompressionStrategy] == ["truncate", "extract", "summarize"]
    assert ContextCompressionStrategy.EXTRACT == CompressionMode.EXTRACT
    assert [i.value for i in MessageImportance] == [1, 2, 3, 4]


def test_it_orders_extract_by_the_documented_priorities():
    messages = [
        SystemMessage("system"),
        HumanMessage("question " * 30),
        AIMessage("thinking about it " * 30),
        AIMessage("", tool_calls=[{"id": "c1", "name": "t", "args": {}}]),
        ToolMessage("Operation failed. timeout", tool_call_id="c1", status="error"),
        HumanMessage("the latest question"),
    ]
    manager = AdvancedContextManager(max_tokens=100_000, compression_mode=CompressionMode.EXTRACT)
    kept = manager.compress(messages, target_tokens=150)
    assert messages[0] in kept and messages[2] not in kept  # MEDIUM dropped before HIGH
    assert kept.result.changes[2].priority is MessagePriority.MEDIUM
    assert kept.result.changes[4].priority is MessagePriority.HIGH  # ToolMessage with errors


# ============================================================== compression (v2.0)


def test_it_runs_the_v2_0_config_usage_example_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # 序列化配置
    config = ContextCompressionConfig()
    config_dict = config.to_dict()

    # 保存到文件
    with open("config.json", "w") as f:
        json.dump(config_dict, f)

    # 从文件加载
    with open("config.json") as f:
        loaded = ContextCompressionConfig.from_dict(json.load(f))

    # 验证配置
    assert loaded.validate() is True
    assert loaded == config


def test_it_accepts_the_v2_0_config_keywords_and_attributes():
    config = ContextCompressionConfig(
        strategy=ContextCompressionStrategy.SUMMARIZE,
        enable_llm_summarization=True,
        llm_summarization_threshold=50,
        summary_cache_ttl=24,
        max_compression_cost_per_hour=0.1,
    )
    assert config.strategy is CompressionMode.SUMMARIZE
    assert config.llm_threshold == 50
    assert config.summary_cache_ttl == 24  # hours
    assert config.summary_cache_ttl_seconds == 24 * 3600
    assert config.max_cost_per_hour == 0.1
    assert ContextCompressionConfig.from_dict({"strategy": "truncate", "llm_threshold": 10, "max_cost_per_hour": 0.5}).llm_threshold == 10
    with pytest.raises(ValueError):
        ContextCompressionConfig(llm_summarization_threshold=-1).validate()
    with pytest.raises(ValueError):
        ContextCompressionConfig(max_compression_cost_per_hour=-1).validate()


def test_it_estimates_compression_cost_as_documented():
    assert CompressionCostEstimate.estimate_cost(ContextCompressionStrategy.TRUNCATE, 10_000) == 0.0
    assert CompressionCostEstimate.estimate_cost(ContextCompressionStrategy.EXTRACT, 10_000) == pytest.approx(0.01)
    assert CompressionCostEstimate.estimate_cost(ContextCompressionStrategy.SUMMARIZE, 10_000) == pytest.approx(0.03)


def test_it_runs_the_llm_compressor_as_documented():
    compressor = LLMCompressor(model="claude-3-haiku", max_summary_tokens=500, timeout_ms=10000)
    messages = [
        {"role": "user", "content": "Show me sales by region"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "query_database", "input": {}}]},
        {"role": "assistant", "content": "North grew 12%."},
    ]
    prompt = compressor._build_summary_prompt(messages, ["tool_calls", "errors"])
    assert "重点关注：tool_calls, errors" in prompt and "[调用工具: query_database]" in prompt
    # no model configured (no anthropic client here): the documented fallback to key facts
    summary = asyncio.run(compressor.summarize_messages(messages, focus_areas=["decisions"]))
    assert "用户: Show me sales by region" in summary and "North grew 12%." in summary
    # with a chat model (fake LLM) it is the model's answer
    llm = FakeListChatModel(responses=["Sales by region were reviewed."])
    assert asyncio.run(LLMCompressor(llm=llm).summarize_messages(messages)) == "Sales by region were reviewed."


def conversation_dicts(rounds: int) -> list[tuple[dict, str]]:
    out = []
    for r in range(rounds):
        rid = f"round-{r}"
        out.append(({"role": "user", "content": f"Question {r}: " + "sales by region please " * 20}, rid))
        out.append(({"role": "assistant", "content": f"Answer {r}: " + "revenue grew steadily " * 20}, rid))
    return out


@pytest.mark.parametrize("manager_class", [AdvancedContextManager, BasicContextManager, ThreadSafeContextManager])
def test_it_runs_the_v2_0_stateful_context_managers_as_written(manager_class):
    manager = manager_class(max_tokens=2000)
    assert manager.max_tokens == 2000 and manager.compression_threshold == 0.8
    for message, round_id in conversation_dicts(3):
        manager.add_message(message, importance=MessageImportance.MEDIUM, round_id=round_id)
    assert manager.total_tokens == sum(count_message_tokens(m) for m, _ in conversation_dicts(3))
    assert manager.get_compressed_messages() == [m for m, _ in conversation_dicts(3)]  # under the threshold
    for message, round_id in conversation_dicts(20)[6:]:
        manager.add_message(message, MessageImportance.HIGH, round_id)
    history = manager.get_compressed_messages()
    assert manager.total_tokens <= 2000 * 0.8
    assert len(history) < 40 and history[-1] == conversation_dicts(20)[-1][0]  # newest kept
    assert manager.total_tokens == sum(count_message_tokens(m) for m in history)
    assert isinstance(manager.get_messages(), list)


def test_it_marks_summarised_rounds_as_the_documents_show():
    manager = AdvancedContextManager(
        max_tokens=2000, compression_config=ContextCompressionConfig(strategy=ContextCompressionStrategy.SUMMARIZE)
    )
    assert manager.config.strategy is CompressionMode.SUMMARIZE
    for message, round_id in conversation_dicts(20):
        manager.add_message(message, round_id=round_id)
    history = manager.get_compressed_messages()
    compressed = [m for m in history if m.get("compressed")]
    assert compressed and compressed[0]["role"] == "system"
    assert compressed[0]["content"].startswith("[Conversation summary:")
    assert compressed[0]["original_round_id"] == "round-0"


def test_it_wraps_messages_as_documented():
    from datetime import datetime

    wrapper = MessageWrapper(
        message={"role": "user", "content": "hi"}, importance=MessageImportance.CRITICAL, timestamp=datetime.now(), tokens=5, round_id="r1"
    )
    assert wrapper.is_compressed is False and wrapper.compressed_content is None


def test_it_adds_messages_from_many_threads():
    manager = ThreadSafeContextManager(max_tokens=10_000_000)
    threads = [
        threading.Thread(target=lambda n=n: [manager.add_message({"role": "user", "content": f"m{n}-{i}"}, round_id=str(n)) for i in range(50)])
        for n in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(manager.get_compressed_messages()) == 400


def test_it_gives_basic_compress_the_documented_list():
    messages = conversation_messages(12)
    kept = BasicContextManager(max_tokens=3000).compress(messages)
    assert isinstance(kept, list) and kept.result.mode is CompressionMode.TRUNCATE
    assert kept[0] is messages[0]


# ============================================================== conversation model


def test_it_builds_the_v2_1_conversation_round_as_written():
    request = ToolInvocationRequest(tool_call_id="call_1", tool_name="query_database", parameters={"q": "sales"})
    round_ = ConversationRound(
        round_id="r1",
        user_message="Sales by region?",
        thoughts=["I need the orders table"],
        tool_calls=[request],
        tool_observations=["north: 100"],
        final_answer="North leads.",
        tokens_used=120,
    )
    assert round_.tool_calls[0].tool_name == "query_database" and round_.status == "pending"


def test_it_runs_the_v2_0_multi_round_conversation_as_written():
    conversation = MultiRoundConversation(user_id="u1", context_window_limit=1000)
    assert conversation.compression_threshold == 0.8
    for r in range(8):
        conversation.rounds.append(
            ConversationRound(
                conversation_id=conversation.conversation_id,
                user_message=f"question {r}",
                tool_calls=[ToolInvocationRequest(tool_call_id=f"c{r}", tool_name="query_database", parameters={"r": r})],
                tool_observations=[f"observation {r}"],
                final_answer=f"answer {r}",
                tokens_used=50,
            )
        )
    assert conversation.should_compress_context() is False  # 400 <= 800
    full = conversation.get_compressed_history()
    assert len(full) == 8 * 4
    assert full[1]["content"][0] == {"type": "tool_use", "id": "c0", "name": "query_database", "input": {"r": 0}}
    assert full[2]["content"][0]["type"] == "tool_result" and full[2]["content"][0]["content"] == "observation 0"

    for round_ in conversation.rounds:
        round_.tokens_used = 200
    assert conversation.should_compress_context() is True  # 1600 > 800
    history = conversation.get_compressed_history()
    assert [m["role"] for m in history[:3]] == ["system", "system", "system"]  # 3 old rounds summarised
    assert history[0]["content"].startswith(f"Round {conversation.rounds[0].round_id}:")
    assert "  Tools: ['query_database']" in history[0]["content"]
    assert len(history) == 3 + 5 * 4  # the last 5 rounds complete


def test_it_counts_round_tokens_with_the_token_counter_when_not_given():
    conversation = MultiRoundConversation(user_id="u1")
    round_ = ConversationRound(conversation_id=conversation.conversation_id, user_message="Hello, world!", final_answer="Hi")
    conversation.add_round(round_)
    assert round_.tokens_used == sum(count_message_tokens(m) for m in conversation._round_to_messages(round_))
    assert conversation.total_tokens() == round_.tokens_used


# ============================================================== skills


def test_it_builds_the_v2_1_activation_request_as_written():
    request = SkillActivationRequest(
        skill_name="sales-report", activation_id="act_1", load_level=2, activation_depth=0, max_depth=3, activation_chain=[]
    )
    assert request.can_activate_nested("data-cleaning") is True
    nested = request.create_nested_request("data-cleaning")
    assert nested.activation_chain == ["sales-report"] and nested.activation_depth == 1
    assert nested.can_activate_nested("sales-report") is False  # A → B → A


def test_it_builds_the_v2_0_activation_request_with_its_context():
    request = SkillActivationRequest(
        skill_name="a",
        conversation_id="conv-1",
        user_request="build the report",
        conversation_history=[{"role": "user", "content": "build the report"}],
    )
    b = request.create_nested_request("b")
    assert (b.conversation_id, b.user_request, b.conversation_history) == ("conv-1", "build the report", request.conversation_history)
    with pytest.raises(ValueError, match="Circular dependency detected: a → b → a"):
        b.create_nested_request("a")


def test_it_builds_the_activation_result_models_as_written():
    result = SkillActivationResult(
        activation_id="act_1",
        skill_name="sales-report",
        messages=[SkillMessage(type="instruction", content="do it", visibility="hidden")],
        context_modifier=ContextModifier(allowed_tools=["query_database"], model=None, disable_model_invocation=False),
        success=True,
    )
    assert result.error is None and result.context_modifier.allows("query_database")


def test_it_loads_skills_level_by_level_with_load_skill():
    loader = SkillLoader(SKILLS)
    one = loader.load_skill("sales-report", 1)
    two = loader.load_skill("sales-report", level=2)
    three = loader.load_skill("sales-report", 3)
    assert isinstance(one, SkillActivationResult) and one.success and one.activation_id
    assert [m.type for m in one.messages][0] == "metadata" and "instruction" not in [m.type for m in one.messages]
    assert "instruction" in [m.type for m in two.messages]
    assert any("Query the `orders` table" in m.content for m in two.messages)
    assert three.load_level == 3 and len("".join(m.content for m in three.messages)) > len("".join(m.content for m in two.messages))
    assert two.context_modifier.allowed_tools == frozenset({"query_database", "run_python"})
    assert loader._load_frontmatter("sales-report")["name"] == "sales-report"
    assert "# Sales report" in loader._load_skill_md("sales-report")
    assert any(name.endswith(".py") for name in loader._load_resources("sales-report"))


def test_it_runs_the_v2_0_activation_stack_example_as_written():
    stack = SkillActivationStack(max_depth=3)
    assert stack.push("skill_a", "act_1") is True
    stack.push("skill_b", "act_2")
    stack.push("skill_c", "act_3")
    assert stack.get_stack_names() == stack.get_chain() == ["skill_a", "skill_b", "skill_c"]
    assert stack.get_depth() == 3 and stack.contains("skill_b")
    assert stack.pop("skill_c", "act_3") is True
    stack.pop("skill_b", "act_2")
    stack.pop("skill_a", "act_1")
    assert stack.get_depth() == 0
    with SkillActivationStack() as scoped:
        scoped.push("skill_a", "act_1")
        with pytest.raises(ValueError, match="Circular dependency detected: skill_a → skill_a"):
            scoped.push("skill_a", "act_2")
    assert scoped.get_depth() == 0  # __exit__ empties the stack


def test_it_manages_locks_as_documented():
    manager = LockManager(max_locks=1000)
    with manager.acquire("conv-1", timeout=1.0) as lock:
        assert manager.get_ref_count("conv-1") == 1
        assert lock.acquire(blocking=False)  # an RLock: re-entrant
        lock.release()
        assert manager.cleanup("conv-1") is False  # in use
    assert manager.get_ref_count("conv-1") == 0
    assert manager.cleanup("conv-1") is True
    manager.clear_all()
    assert get_lock_manager() is get_lock_manager()


def compiled_graph():
    from langgraph.checkpoint.memory import MemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    def agent(state: MessagesState):
        return {"messages": [AIMessage("Hello! How can I help?")]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=MemorySaver())


def test_it_injects_skill_messages_into_a_real_langgraph_graph():
    graph = compiled_graph()
    config = {"configurable": {"thread_id": "conv-1"}}
    graph.invoke({"messages": [HumanMessage("hi")]}, config)
    skill = SkillActivationResult(
        activation_id="act_1",
        skill_name="sales-report",
        messages=[
            SkillMessage(type="metadata", content="Activating sales-report"),
            SkillMessage(type="instruction", content="Query the orders table.", visibility="hidden"),
        ],
        context_modifier=ContextModifier(),
        success=True,
    )
    ok = MessageInjectionProtocol.inject_into_state(skill.to_llm_messages(), "conv-1", graph)
    assert ok is True
    messages = graph.get_state(config).values["messages"]
    assert [type(m).__name__ for m in messages] == ["HumanMessage", "AIMessage", "HumanMessage", "HumanMessage"]
    assert [m.content for m in messages[2:]] == ["Activating sales-report", "Query the orders table."]
    assert messages[3].additional_kwargs.get("isMeta") is True
    # the documents' dict roles: user -> HumanMessage, assistant -> AIMessage with additional_kwargs
    ok = MessageInjectionProtocol.inject_into_state(
        [{"role": "assistant", "content": "noted", "additional_kwargs": {"skill": "sales-report"}}], "conv-1", graph, get_lock_manager()
    )
    assert ok is True
    last = graph.get_state(config).values["messages"][-1]
    assert isinstance(last, AIMessage) and last.additional_kwargs == {"skill": "sales-report"}
    # the graph runs on with the injected messages in its state
    graph.invoke({"messages": [HumanMessage("go on")]}, config)
    assert len(graph.get_state(config).values["messages"]) == 7
    # another thread's state is untouched
    assert graph.get_state({"configurable": {"thread_id": "conv-2"}}).values == {}


def test_it_injects_from_many_threads_into_one_langgraph_thread_without_losing_any():
    graph = compiled_graph()
    config = {"configurable": {"thread_id": "conv-9"}}
    graph.invoke({"messages": [HumanMessage("hi")]}, config)
    threads = [
        threading.Thread(
            target=MessageInjectionProtocol.inject_into_state,
            args=([{"role": "user", "content": f"skill message {n}"}], "conv-9", graph),
        )
        for n in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    contents = [m.content for m in graph.get_state(config).values["messages"]]
    assert sorted(c for c in contents if c.startswith("skill message")) == sorted(f"skill message {n}" for n in range(16))


def test_it_returns_false_when_the_graph_has_no_checkpointer():
    from langgraph.graph import START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": []})
    builder.add_edge(START, "agent")
    graph = builder.compile()  # no checkpointer: get_state raises
    assert MessageInjectionProtocol.inject_into_state([{"role": "user", "content": "x"}], "conv-1", graph) is False


def test_it_gives_the_v2_1_per_conversation_lock_without_eviction():
    lock = MessageInjectionProtocol._get_lock("conv-lock")
    other = MessageInjectionProtocol._get_lock("conv-lock")
    assert lock.acquire()
    assert get_lock_manager().ref_count("conv-lock") == 1
    got = []
    waiter = threading.Thread(target=lambda: got.append(other.acquire(timeout=0.05)))
    waiter.start()
    waiter.join()
    assert got == [False]  # the same conversation's lock, held: no second holder
    lock.release()
    assert get_lock_manager().ref_count("conv-lock") == 0
    with other:
        with MessageInjectionProtocol._conversation_lock("conv-lock"):  # re-entrant in one thread
            pass
    with pytest.raises(RuntimeError):
        lock.release()
