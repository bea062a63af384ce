"""Context compression (ContextCompressionConfig, AdvancedContextManager,
BasicContextManager): the config and the three modes, counted with the real
DynamicTokenCounter; reading, priorities and pairing are in test_messages.py. The
LLM and the clock are the only fakes, and the tests that use them say so."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from pipeline import (
    AdvancedContextManager,
    BasicContextManager,
    CompressionMode,
    CompressionRecord,
    ContextCompressionConfig,
    ExtractiveSummarizer,
    LLMSummarizer,
    MessageAction,
    MessagePriority,
    parse_record,
)
from pipeline._exceptions import ConfigError
from tests.pipeline.conversations import COUNTER, MODEL, call, conversation, manager, tokens

P = MessagePriority
A = MessageAction


def kept_indices(result: Any) -> list[int]:
    return [c.index for c in result.changes if c.action in (A.KEPT, A.TRUNCATED)]


def assert_invariants(messages: list[Any], output: list[Any], result: Any) -> None:
    """What every compression promises, whatever the mode."""
    assert [c.index for c in result.changes] == list(range(len(messages)))
    assert result.tokens_before == sum(c.tokens_before for c in result.changes) == tokens(messages)
    assert result.tokens_after == tokens(output)
    assert result.tokens_after == sum(c.tokens_after for c in result.changes) + sum(s.tokens for s in result.summaries)
    assert result.messages_after == len(output)
    assert result.target_met == (result.tokens_after <= result.target_tokens)
    if not result.target_met:
        assert result.only_protected_remain
        assert all(c.priority is P.CRITICAL for c in result.changes if c.tokens_after)
    for change in result.changes:
        if change.action is A.KEPT:
            assert output[change.new_index] is messages[change.index]
        elif change.action is A.TRUNCATED:
            assert output[change.new_index] is not messages[change.index]
            assert change.content_after
        else:
            assert change.new_index is None and change.tokens_after == 0
        if change.priority is P.CRITICAL:
            assert change.action is A.KEPT
        assert (change.summary_id is not None) == (change.action is A.SUMMARIZED)
    for summary in result.summaries:
        assert output[summary.new_index] is not None
    assert_paired(output)


def ids_of(message: Any) -> tuple[set[str], set[str]]:
    """(calls made, calls answered) of a dict or LangChain message."""
    if isinstance(message, dict):
        calls = {c["id"] for c in message.get("tool_calls") or []}
        answers = {message["tool_call_id"]} if message.get("tool_call_id") else set()
        content = message.get("content")
    else:
        calls = {c["id"] for c in getattr(message, "tool_calls", [])}
        answers = {message.tool_call_id} if isinstance(message, ToolMessage) else set()
        content = message.content
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            calls.add(block["id"])
        if isinstance(block, dict) and block.get("type") == "tool_result":
            answers.add(block["tool_use_id"])
    return calls, answers


def assert_paired(output: list[Any]) -> None:
    made: set[str] = set()
    answered: set[str] = set()
    for message in output:
        calls, answers = ids_of(message)
        made |= calls
        answered |= answers
    assert answered <= made, f"orphaned tool results: {answered - made}"
    assert made <= answered, f"tool calls without their results: {made - answered}"


# ----------------------------------------------------------------------- config


def test_it_has_the_seed_defaults() -> None:
    config = ContextCompressionConfig()
    assert config.strategy is CompressionMode.EXTRACT
    assert (config.threshold_ratio, config.target_ratio, config.max_tokens) == (0.8, 0.5, 200_000)
    assert config.target_tokens == 100_000
    assert config.enable_llm_summarization is False
    assert config.validate() is True


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("strategy", "shrink"),
        ("strategy", 3),
        ("keep_recent", -1),
        ("keep_recent", True),
        ("keep_recent", 2.5),
        ("threshold_ratio", 0),
        ("threshold_ratio", 1.5),
        ("threshold_ratio", float("nan")),
        ("max_tokens", 0),
        ("max_tokens", "200000"),
        ("target_ratio", -0.5),
        ("target_ratio", 0.9),  # above threshold_ratio
        ("enable_llm_summarization", "yes"),
        ("llm_summarization_threshold", -3),
        ("summary_cache_ttl_seconds", 0),
        ("max_cost_per_hour_usd", -0.01),
        ("max_cost_per_hour_usd", float("inf")),
        ("truncate_max_chars", 10),
        ("summary_max_tokens", 0),
        ("summary_timeout_seconds", 0),
    ],
)
def test_it_names_the_bad_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        ContextCompressionConfig(**{field: value}).validate()
    assert raised.value.field == field
    with pytest.raises(ConfigError) as raised:
        ContextCompressionConfig.from_dict({field: value})
    assert raised.value.field == field


def test_it_round_trips_through_a_dict() -> None:
    config = ContextCompressionConfig(strategy=CompressionMode.SUMMARIZE, keep_recent=4, max_tokens=8_000)
    data = config.to_dict()
    assert data["strategy"] == "summarize"
    assert ContextCompressionConfig.from_dict(data) == config
    assert ContextCompressionConfig.from_dict({"strategy": "truncate"}).strategy is CompressionMode.TRUNCATE


def test_it_refuses_unknown_keys_and_non_mappings() -> None:
    with pytest.raises(ConfigError) as raised:
        ContextCompressionConfig.from_dict({"max_cost_per_day": 1})
    assert raised.value.field == "max_cost_per_day"
    with pytest.raises(ConfigError):
        ContextCompressionConfig.from_dict(["strategy"])  # type: ignore[arg-type]


def test_it_decides_when_to_compress() -> None:
    config = ContextCompressionConfig(max_tokens=1_000)
    assert not config.should_compress(800)
    assert config.should_compress(801)
    with pytest.raises(ValueError):
        config.should_compress(-1)
    assert manager(max_tokens=100).should_compress(conversation(2))


def test_it_refuses_an_invalid_config_at_construction() -> None:
    config = ContextCompressionConfig()
    config.keep_recent = -2
    with pytest.raises(ConfigError):
        AdvancedContextManager(config, token_counter=COUNTER)
    with pytest.raises(TypeError):
        AdvancedContextManager({"keep_recent": 2}, token_counter=COUNTER)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AdvancedContextManager(token_counter=object())


def test_it_validates_a_config_changed_after_construction() -> None:
    ctx = manager()
    ctx.config.target_ratio = 2.0
    with pytest.raises(ConfigError) as raised:
        ctx.compress(conversation(2))
    assert raised.value.field == "target_ratio"


# ------------------------------------------------------------------------ modes


def test_it_keeps_everything_under_the_target() -> None:
    messages = conversation(3)
    output, result = manager().compress_with_result(messages, target_tokens=tokens(messages))
    assert output == messages and all(a is b for a, b in zip(output, messages))
    assert result.count(A.KEPT) == len(messages) and result.target_met
    assert result.changes[1].reason == "within target: nothing to drop"


def test_it_truncate_keeps_the_system_message_and_the_newest_that_fit() -> None:
    messages = conversation(12)
    target = tokens(messages) // 3
    output, result = manager().compress_with_result(messages, target_tokens=target, mode=CompressionMode.TRUNCATE)
    assert_invariants(messages, output, result)
    kept = kept_indices(result)
    assert kept[0] == 0
    assert kept[1:] == list(range(kept[1], len(messages)))  # a contiguous newest suffix
    assert result.mode is CompressionMode.TRUNCATE and result.target_met
    assert tokens(messages[kept[1] - 1 :]) + tokens(messages[:1]) > target  # one more would not fit


def test_it_truncate_shortens_an_oversized_newest_message_rather_than_drop_it() -> None:
    question = "Please analyse this export. " + "row,east,1200\n" * 3_000
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}, {"role": "user", "content": question}]
    output, result = manager().compress_with_result(messages, target_tokens=500, mode="truncate")
    assert_invariants(messages, output, result)
    assert [c.action for c in result.changes] == [A.KEPT, A.DROPPED, A.TRUNCATED]
    shortened = output[-1]
    assert shortened["content"].startswith("Please analyse this export.")
    assert "…[truncated:" in shortened["content"]
    assert messages[-1]["content"] == question  # the caller's message is untouched
    assert result.changes[2].content_after.startswith("Please analyse")
    assert result.changes[2].content_cut is True and len(result.changes[2].content_before) == 2_000
    assert result.target_met and result.tokens_after <= 500


def test_it_bounds_a_truncated_message_by_truncate_max_chars() -> None:
    messages = [{"role": "user", "content": "word " * 20_000}]
    output, result = manager(truncate_max_chars=100).compress_with_result(messages, target_tokens=5_000, mode="truncate")
    assert result.changes[0].action is A.TRUNCATED
    assert output[0]["content"].startswith("word " * 20)
    assert len(output[0]["content"]) < 100 + 80


def test_it_shortens_a_tool_result_block_and_keeps_its_call() -> None:
    messages = [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "export", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "line of the export\n" * 2_000}]},
    ]
    output, result = manager().compress_with_result(messages, target_tokens=400, mode=CompressionMode.EXTRACT)
    assert_invariants(messages, output, result)
    assert [c.action for c in result.changes] == [A.KEPT, A.TRUNCATED]
    block = output[1]["content"][0]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "t1"
    assert block["content"].startswith("line of the export") and "…[truncated:" in block["content"]
    assert result.changes[0].reason == "kept with the shortened message it is paired with; tool call paired with its results in message 1"


def test_it_extract_drops_low_then_medium_before_high() -> None:
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "first question " * 30},
        {"role": "assistant", "content": "debug " * 100, "verbose": True},
        {"role": "assistant", "content": "a plain answer " * 30},
        {"role": "user", "content": "second question " * 30},
        {"role": "assistant", "content": "another plain answer " * 30},
        {"role": "user", "content": "third question"},
    ]
    ctx = manager(keep_recent=1)
    total = tokens(messages)
    # Just enough pressure to drop the log: only LOW goes.
    output, result = ctx.compress_with_result(messages, target_tokens=total - 50)
    assert [c.action for c in result.changes] == [A.KEPT, A.KEPT, A.DROPPED, A.KEPT, A.KEPT, A.KEPT, A.KEPT]
    assert result.changes[2].reason == "dropped: low priority, oldest first"
    # More pressure: the MEDIUM answers go (oldest first), the users stay.
    target = total - tokens(messages[2:4]) - 5
    output, result = ctx.compress_with_result(messages, target_tokens=target)
    assert_invariants(messages, output, result)
    assert [c.action for c in result.changes] == [A.KEPT, A.KEPT, A.DROPPED, A.DROPPED, A.KEPT, A.DROPPED, A.KEPT]
    assert output[1] is messages[1] and output[-1] is messages[-1]


def test_it_extract_spares_the_recent_window() -> None:
    messages = conversation(10)
    ctx = manager(keep_recent=8)
    target = tokens(messages) // 2
    output, result = ctx.compress_with_result(messages, target_tokens=target)
    assert_invariants(messages, output, result)
    assert all(c.action is A.KEPT for c in result.changes[-8:])
    assert "within the last 8 messages" in result.changes[-1].reason
    assert result.changes[-8].reason.startswith("kept: within the last 8 messages")


def test_it_extract_drops_into_the_recent_window_when_it_alone_busts_the_target() -> None:
    messages = conversation(6)
    target = tokens(messages[:1]) + tokens(messages[-3:])
    output, result = manager(keep_recent=12).compress_with_result(messages, target_tokens=target)
    assert_invariants(messages, output, result)
    assert result.target_met
    dropped_recent = [c for c in result.changes[-12:] if c.action is A.DROPPED]
    assert dropped_recent and all("alone exceed the target" in c.reason for c in dropped_recent)


def test_it_keeps_a_tool_call_and_all_its_results_together() -> None:
    messages = [
        {"role": "user", "content": "compare east and west"},
        {"role": "assistant", "content": None, "tool_calls": [call("e"), call("w")]},
        {"role": "tool", "tool_call_id": "e", "content": "east " * 200},
        {"role": "tool", "tool_call_id": "w", "content": "west " * 200},
        {"role": "assistant", "content": "East and west are level."},
        {"role": "user", "content": "thanks"},
    ]
    for mode in CompressionMode:
        target = tokens(messages) - tokens(messages[2:3]) + 1  # dropping one result alone would do
        output, result = manager(keep_recent=0).compress_with_result(messages, target_tokens=target, mode=mode)
        assert_invariants(messages, output, result)
        actions = {result.changes[i].action for i in (1, 2, 3)}
        assert len(actions) == 1, (mode, actions)
    assert "paired with its results in messages 2, 3" in result.changes[1].reason


def test_it_reports_when_only_protected_messages_remain() -> None:
    messages = [{"role": "system", "content": "rule " * 400}, {"role": "user", "content": "short question"}]
    for mode in CompressionMode:
        output, result = manager().compress_with_result(messages, target_tokens=50, mode=mode)
        assert output == [messages[0]]
        assert not result.target_met and result.only_protected_remain
        assert result.changes[1].action is A.DROPPED
    output, result = manager().compress_with_result(messages[:1], target_tokens=50)
    assert output == messages[:1] and result.only_protected_remain


def test_it_handles_an_empty_list() -> None:
    output, result = manager().compress_with_result([], target_tokens=10)
    assert output == [] and result.changes == []
    assert (result.tokens_before, result.tokens_after, result.messages_after) == (0, 0, 0)
    assert result.target_met and not result.only_protected_remain


def test_it_returns_langchain_messages_for_langchain_input() -> None:
    messages: list[Any] = [SystemMessage("rules")]
    for r in range(8):
        messages += [
            HumanMessage(f"question {r} " * 20),
            AIMessage("", tool_calls=[{"name": "sql", "args": {"r": r}, "id": f"c{r}"}]),
            ToolMessage(f"rows {r} " * 60, tool_call_id=f"c{r}"),
            AIMessage(f"answer {r} " * 20),
        ]
    for mode in CompressionMode:
        output, result = manager(keep_recent=2).compress_with_result(messages, target_tokens=tokens(messages) // 3, mode=mode)
        assert_invariants(messages, output, result)
        assert all(type(m).__name__ in {"SystemMessage", "HumanMessage", "AIMessage", "ToolMessage"} for m in output)
        assert result.mode is mode and result.target_met
    summary = output[result.summaries[0].new_index]
    assert isinstance(summary, SystemMessage)
    assert summary.additional_kwargs["summary_id"] == result.summaries[0].summary_id
    assert summary.content.startswith("[Conversation summary: ")


def test_it_truncates_a_langchain_message_by_copy() -> None:
    messages = [SystemMessage("rules"), HumanMessage("数据如下：" + "扬州分公司销售额上升。" * 800)]
    output, result = manager().compress_with_result(messages, target_tokens=300, mode="truncate")
    assert result.changes[1].action is A.TRUNCATED
    assert isinstance(output[1], HumanMessage) and output[1] is not messages[1]
    assert output[1].content.startswith("数据如下：扬州分公司")
    assert result.tokens_after == tokens(output) <= 300


def test_it_compresses_chinese_conversations() -> None:
    messages: list[dict] = [{"role": "system", "content": "你是一个商业分析助手。"}]
    for r in range(10):
        messages.append({"role": "user", "content": f"第{r}个问题：请统计扬州分公司的销售额。按月份拆分。" * 3})
        messages.append({"role": "assistant", "content": f"第{r}轮的分析结果：销售额同比增长百分之{r}。主要来自线上渠道。" * 5})
    target = tokens(messages) // 2
    for mode in CompressionMode:
        output, result = manager(keep_recent=2).compress_with_result(messages, target_tokens=target, mode=mode)
        assert_invariants(messages, output, result)
        assert result.target_met
    assert "- user: 第0个问题：请统计扬州分公司的销售额。" in result.summaries[0].text


def test_it_summarize_replaces_the_oldest_span_with_one_system_message() -> None:
    messages = conversation(12)
    target = tokens(messages) // 2
    output, result = manager(keep_recent=4).compress_with_result(messages, target_tokens=target, mode=CompressionMode.SUMMARIZE)
    assert_invariants(messages, output, result)
    assert result.mode is result.requested_mode is CompressionMode.SUMMARIZE and result.fallback_reason is None
    (summary,) = result.summaries
    assert summary.summarizer == "extractive" and summary.cached is False and summary.estimated_cost_usd == 0
    assert summary.new_index == 1 and output[0] is messages[0]
    assert summary.replaced_indices == list(range(1, summary.replaced_indices[-1] + 1))
    message = output[1]
    assert message["role"] == "system" and message["summary_id"] == summary.summary_id
    assert message["content"] == summary.text
    assert message["content"].startswith(f"[Conversation summary: {len(summary.replaced_indices)} earlier messages]")
    assert "- user: Question 0:" in summary.text
    replaced = [c for c in result.changes if c.action is A.SUMMARIZED]
    assert [c.index for c in replaced] == summary.replaced_indices
    assert all(c.summary_id == summary.summary_id for c in replaced)
    assert all(c.action is A.KEPT for c in result.changes[-4:])


def test_it_lets_a_later_summary_absorb_an_earlier_one() -> None:
    ctx = manager(keep_recent=2)
    messages = conversation(10)
    first, result1 = ctx.compress_with_result(messages, target_tokens=tokens(messages) // 2, mode="summarize")
    grown = first + conversation(10, start=10)[1:]
    second, result2 = ctx.compress_with_result(grown, target_tokens=tokens(grown) // 2, mode="summarize")
    assert_invariants(grown, second, result2)
    old_summary = result2.changes[1]
    assert old_summary.priority is P.HIGH and old_summary.action is A.SUMMARIZED
    assert sum(1 for m in second if m.get("summary_id")) == 1


def test_it_fills_each_change_for_the_diff_page() -> None:
    messages = conversation(6)
    _, result = manager(keep_recent=2).compress_with_result(messages, target_tokens=tokens(messages) // 2)
    dropped_call = next(c for c in result.changes if c.action is A.DROPPED and c.role == "assistant" and c.tool_call_ids)
    assert dropped_call.tokens_after == 0 and dropped_call.new_index is None
    assert dropped_call.content_before.startswith("[tool call] sql_query(")
    assert "tool call paired with its results in message" in dropped_call.reason
    assert result.config == manager(keep_recent=2).config.to_dict()
    assert result.duration_ms > 0 and result.model == MODEL


def test_it_produces_a_result_the_dashboard_accepts() -> None:
    messages = conversation(6)
    _, result = manager(keep_recent=2).compress_with_result(messages, target_tokens=tokens(messages) // 2, mode="summarize")
    record = CompressionRecord(conversation_id="conv-1", result=result)
    parsed = parse_record(record.model_dump(mode="json"))
    assert parsed.result == result


# -------------------------------------------------------------------- bad input


@pytest.mark.parametrize("target", [0, -1, True, 1.5, "100"])
def test_it_refuses_a_target_that_is_not_a_positive_integer(target: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        manager().compress(conversation(1), target_tokens=target)
    assert raised.value.field == "target_tokens"


def test_it_refuses_an_unknown_mode() -> None:
    with pytest.raises(ConfigError) as raised:
        manager().compress(conversation(1), target_tokens=100, mode="squash")
    assert raised.value.field == "mode"


def test_it_survives_an_oversized_message() -> None:
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "x y z " * 400_000}]
    output, result = manager().compress_with_result(messages, target_tokens=2_000)
    assert_invariants(messages, output, result)
    assert result.changes[1].action is A.TRUNCATED and result.changes[1].content_cut


# ------------------------------------------------------------------ summarisers


class FakeLLM:
    """The LLM edge: answers with a fixed text, optionally waiting for a gate or raising."""

    def __init__(self, reply: str = "Fake summary: the user asked about sales; queries ran.", *, gate: threading.Event | None = None, error: Exception | None = None) -> None:
        self.reply = reply
        self.gate = gate
        self.error = error
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if self.gate is not None:
            self.gate.wait(10)
        if self.error is not None:
            raise self.error
        return self.reply


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def llm_manager(llm: Any, **config: Any) -> AdvancedContextManager:
    config.setdefault("enable_llm_summarization", True)
    config.setdefault("llm_summarization_threshold", 0)
    config.setdefault("keep_recent", 2)
    return manager(summarizer=LLMSummarizer(llm, name="llm:fake"), **config)


def summarize(ctx: AdvancedContextManager, messages: list[dict]) -> tuple[list[Any], Any]:
    output, result = ctx.compress_with_result(messages, target_tokens=tokens(messages) // 2, mode=CompressionMode.SUMMARIZE)
    assert_invariants(messages, output, result)
    assert result.target_met
    return output, result


def test_it_summarizes_with_a_fake_llm_and_estimates_the_cost() -> None:
    llm = FakeLLM()
    output, result = summarize(llm_manager(llm), conversation(8))
    (summary,) = result.summaries
    assert summary.summarizer == "llm:fake" and summary.text.endswith(llm.reply)
    assert summary.estimated_cost_usd > 0
    assert len(llm.prompts) == 1 and "Question 0:" in llm.prompts[0]


def test_it_uses_the_fake_llm_summary_cache_on_a_repeat() -> None:
    llm = FakeLLM()
    ctx = llm_manager(llm)
    messages = conversation(8)
    summarize(ctx, messages)
    _, result = summarize(ctx, messages)
    assert len(llm.prompts) == 1
    assert result.summaries[0].cached is True and result.summaries[0].estimated_cost_usd == 0


def test_it_uses_the_extractive_summary_below_the_llm_threshold_with_a_fake_llm() -> None:
    llm = FakeLLM()
    _, result = summarize(llm_manager(llm, llm_summarization_threshold=1_000), conversation(8))
    assert result.summaries[0].summarizer == "extractive" and llm.prompts == []


def test_it_leaves_a_fake_llm_unused_when_llm_summaries_are_off() -> None:
    llm = FakeLLM()
    _, result = summarize(llm_manager(llm, enable_llm_summarization=False), conversation(8))
    assert result.summaries[0].summarizer == "extractive" and llm.prompts == []


def test_it_falls_back_to_extract_without_a_summarizer() -> None:
    ctx = manager(enable_llm_summarization=True, llm_summarization_threshold=0, keep_recent=2)
    _, result = summarize(ctx, conversation(8))
    assert (result.requested_mode, result.mode) == (CompressionMode.SUMMARIZE, CompressionMode.EXTRACT)
    assert result.fallback_reason == "no summariser given while enable_llm_summarization is on"
    assert result.summaries == [] and result.count(A.SUMMARIZED) == 0 and result.count(A.DROPPED) > 0


def test_it_falls_back_when_the_fake_llm_raises() -> None:
    _, result = summarize(llm_manager(FakeLLM(error=RuntimeError("rate limited"))), conversation(8))
    assert result.mode is CompressionMode.EXTRACT
    assert result.fallback_reason == "summariser failed: RuntimeError: rate limited"


@pytest.mark.parametrize("reply", ["", "   "])
def test_it_falls_back_when_the_fake_llm_returns_nothing(reply: str) -> None:
    _, result = summarize(llm_manager(FakeLLM(reply)), conversation(8))
    assert result.mode is CompressionMode.EXTRACT
    assert "empty summary" in result.fallback_reason


def test_it_falls_back_when_a_fake_summarizer_returns_a_non_string() -> None:
    class FakeSummarizer:
        name = "fake"

        def summarize(self, messages_text: list[str], max_tokens: int) -> Any:
            return None

        def estimate_cost_usd(self, input_tokens: int, output_tokens: int) -> float:
            return 0.0

    ctx = manager(summarizer=FakeSummarizer(), enable_llm_summarization=True, llm_summarization_threshold=0, keep_recent=2)
    _, result = summarize(ctx, conversation(8))
    assert result.fallback_reason == "summariser returned no text"


def test_it_cuts_an_overlong_fake_llm_summary_to_its_budget() -> None:
    _, result = summarize(llm_manager(FakeLLM("word " * 5_000), summary_max_tokens=100), conversation(8))
    summary = result.summaries[0]
    assert result.mode is CompressionMode.SUMMARIZE
    assert summary.tokens <= 100 + 10 and summary.text.endswith(" …")


def test_it_falls_back_when_the_fake_llm_times_out_and_caches_its_late_answer() -> None:
    gate = threading.Event()
    llm = FakeLLM(gate=gate)
    ctx = llm_manager(llm, summary_timeout_seconds=0.05)
    messages = conversation(8)
    try:
        _, result = summarize(ctx, messages)
        assert result.mode is CompressionMode.EXTRACT
        assert result.fallback_reason == "summariser timed out after 0.05 s"
        _, result = summarize(ctx, messages)  # still running: no second thread
        assert result.fallback_reason == "a previous summarisation timed out and is still running"
        assert len(llm.prompts) == 1
    finally:
        gate.set()
    deadline = time.monotonic() + 5
    while ctx._stragglers and time.monotonic() < deadline:
        time.sleep(0.01)
    _, result = summarize(ctx, messages)
    assert result.mode is CompressionMode.SUMMARIZE
    assert result.summaries[0].cached is True and len(llm.prompts) == 1


def test_it_caps_the_cost_per_hour_with_a_fake_clock_and_fake_llm() -> None:
    clock = FakeClock()
    llm = FakeLLM()
    estimate = LLMSummarizer(llm).estimate_cost_usd(tokens(conversation(8)[1:]), 100)
    cap = round(estimate * 2.5, 6)  # room for two calls, not a third
    ctx = llm_manager(llm, clock=clock, max_cost_per_hour_usd=cap, summary_max_tokens=100)
    calls = 0
    while True:
        _, result = summarize(ctx, conversation(8, words=40 + calls))  # new text: no cache hit
        if result.mode is CompressionMode.EXTRACT:
            break
        calls += 1
        assert calls < 10
    assert calls >= 2 and len(llm.prompts) == calls
    assert result.fallback_reason.startswith("cost cap: $")
    assert f"exceeds max_cost_per_hour_usd=${cap:.4f}" in result.fallback_reason
    assert 0 < ctx.spent_last_hour_usd() <= cap
    clock.now += 3_601  # the hour rolls over
    _, result = summarize(ctx, conversation(8, words=99))
    assert result.mode is CompressionMode.SUMMARIZE


def test_it_falls_back_when_there_is_no_room_for_a_summary() -> None:
    messages = [{"role": "system", "content": "rule " * 200}] + conversation(4)[1:]
    target = tokens(messages[:1]) + 10
    output, result = manager(keep_recent=0).compress_with_result(messages, target_tokens=target, mode="summarize")
    assert_invariants(messages, output, result)
    assert result.mode is CompressionMode.EXTRACT
    assert result.fallback_reason == "no room for a summary within the target"


# ----------------------------------------------------------------------- basic


def rounds_conversation(count: int) -> list[dict]:
    return conversation(count)


def test_it_basic_keeps_the_system_message_and_the_last_rounds() -> None:
    messages = rounds_conversation(6)
    basic = BasicContextManager(max_tokens=100_000, keep_recent=2, token_counter=COUNTER, model=MODEL)
    output, result = basic.compress_with_result(messages)
    assert_invariants(messages, output, result)
    assert output == [messages[0], *messages[-8:]]
    assert result.mode is CompressionMode.TRUNCATE and result.target_tokens == 100_000
    assert result.changes[1].reason == "dropped: older than the last 2 rounds"
    assert result.config == {"max_tokens": 100_000, "keep_recent": 2}


def test_it_basic_drops_recent_rounds_over_max_tokens_but_keeps_the_newest() -> None:
    messages = rounds_conversation(6)
    round_tokens = tokens(messages[-4:])
    basic = BasicContextManager(max_tokens=tokens(messages[:1]) + round_tokens + 10, keep_recent=3, token_counter=COUNTER)
    output, result = basic.compress_with_result(messages)
    assert_invariants(messages, output, result)
    assert output == [messages[0], *messages[-4:]]
    assert "the recent rounds alone exceed max_tokens" in result.changes[-5].reason
    tiny = BasicContextManager(max_tokens=10, keep_recent=3, token_counter=COUNTER)
    output, result = tiny.compress_with_result(messages)
    assert output == [messages[0], *messages[-4:]] and not result.target_met


def test_it_basic_starts_no_round_at_a_tool_result_block() -> None:
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "sql", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "rows"}]},
        {"role": "user", "content": "q2"},
    ]
    output, result = BasicContextManager(max_tokens=1_000, keep_recent=1, token_counter=COUNTER).compress_with_result(messages)
    assert output == messages[3:]
    assert_paired(output)


@pytest.mark.parametrize("args", [(0, 2), (100, 0), (True, 2), (100, "2")])
def test_it_basic_refuses_bad_arguments(args: tuple) -> None:
    with pytest.raises(ConfigError):
        BasicContextManager(*args, token_counter=COUNTER)


# ------------------------------------------------------------------- properties

WORDS = st.sampled_from(["sales", "region", "east", "增长", "扬州", "query", "rows", "42", "。", "."])


@st.composite
def conversations(draw: st.DrawFn) -> list[dict]:
    def text(max_words: int) -> str:
        return " ".join(draw(st.lists(WORDS, min_size=1, max_size=max_words)))

    messages: list[dict] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": text(30)})
    for r in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["user", "answer", "tools", "claude_tools", "log"]))
        if kind == "user":
            messages.append({"role": "user", "content": text(60)})
        elif kind == "answer":
            messages.append({"role": "assistant", "content": text(60)})
        elif kind == "log":
            messages.append({"role": "assistant", "content": text(80), "verbose": True})
        elif kind == "tools":
            ids = [f"c{r}_{i}" for i in range(draw(st.integers(1, 3)))]
            messages.append({"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]})
            for i in ids:
                error = draw(st.booleans())
                messages.append({"role": "tool", "tool_call_id": i, "content": ("Operation failed. " if error else "") + text(120)})
        else:
            messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{r}", "name": "sql", "input": {"q": r}}]})
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{r}", "content": text(120)}]})
    return messages


def as_langchain(messages: list[dict]) -> list[Any]:
    """The same conversation as LangChain messages."""
    converted: list[Any] = []
    for m in messages:
        extra = {"verbose": True} if m.get("verbose") else {}
        if m["role"] == "system":
            converted.append(SystemMessage(m["content"]))
        elif m["role"] == "user":
            converted.append(HumanMessage(m["content"]))
        elif m["role"] == "tool":
            converted.append(ToolMessage(m["content"], tool_call_id=m["tool_call_id"]))
        elif m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "args": {"q": 1}, "id": c["id"]} for c in m["tool_calls"]]
            converted.append(AIMessage("", tool_calls=calls))
        else:
            converted.append(AIMessage(m["content"], additional_kwargs=extra))
    return converted


PROPERTY_MANAGER = AdvancedContextManager(ContextCompressionConfig(keep_recent=3), token_counter=COUNTER, model=MODEL)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversations(),
    fraction=st.floats(0.02, 1.2),
    mode=st.sampled_from(list(CompressionMode)),
    langchain=st.booleans(),
)
def test_it_keeps_its_invariants_for_any_conversation(
    messages: list[dict], fraction: float, mode: CompressionMode, langchain: bool
) -> None:
    if langchain:
        messages = as_langchain(messages)
    target = max(1, int(tokens(messages) * fraction))
    output, result = PROPERTY_MANAGER.compress_with_result(messages, target_tokens=target, mode=mode)
    assert_invariants(messages, output, result)
    assert result.tokens_after <= target or result.only_protected_remain
    assert result.mode is mode or (mode is CompressionMode.SUMMARIZE and result.fallback_reason)


@settings(max_examples=25, deadline=None)
@given(messages=conversations(), fraction=st.floats(0.02, 1.0), rounds=st.integers(1, 4))
def test_it_basic_never_orphans_a_tool_result(messages: list[dict], fraction: float, rounds: int) -> None:
    max_tokens = max(1, int(tokens(messages) * fraction))
    output, result = BasicContextManager(max_tokens, rounds, token_counter=COUNTER).compress_with_result(messages)
    assert_paired(output)
    assert [c.index for c in result.changes] == list(range(len(messages)))
    assert result.tokens_after == tokens(output) == sum(c.tokens_after for c in result.changes)
    assert all(output[c.new_index] is messages[c.index] for c in result.changes if c.action is A.KEPT)


def test_it_falls_back_when_a_fake_summarizer_cannot_estimate_its_cost() -> None:
    class FakeSummarizer:
        name = "fake"

        def summarize(self, messages_text: list[str], max_tokens: int) -> str:
            raise AssertionError("never called: the estimate failed first")

        def estimate_cost_usd(self, input_tokens: int, output_tokens: int) -> float:
            raise RuntimeError("pricing table missing")

    ctx = manager(summarizer=FakeSummarizer(), enable_llm_summarization=True, llm_summarization_threshold=0, keep_recent=2)
    _, result = summarize(ctx, conversation(8))
    assert result.mode is CompressionMode.EXTRACT
    assert result.fallback_reason == "summariser gave an invalid cost estimate (nan)"


# --- the design's constructor forms (the examples themselves: test_design_examples_context)


def test_it_refuses_constructor_forms_that_contradict_each_other() -> None:
    config = ContextCompressionConfig()
    with pytest.raises(TypeError):
        AdvancedContextManager(config, compression_config=config)
    with pytest.raises(TypeError):
        AdvancedContextManager(100_000, max_tokens=100_000)
    with pytest.raises(TypeError):
        AdvancedContextManager(summarizer=ExtractiveSummarizer(len), llm_summarizer=lambda prompt: "x")
    with pytest.raises(TypeError):
        AdvancedContextManager("not a config")
    with pytest.raises(ConfigError):
        AdvancedContextManager(max_tokens=0)
    with pytest.raises(ConfigError):
        AdvancedContextManager(compression_mode="squash")
    with pytest.raises(ConfigError):
        ContextCompressionConfig(llm_threshold=5, llm_summarization_threshold=5)
    with pytest.raises(ConfigError):
        ContextCompressionConfig.from_dict({"max_cost_per_hour": 1, "max_cost_per_hour_usd": 1})


def test_it_applies_the_design_keywords_on_a_copy_of_the_config() -> None:
    config = ContextCompressionConfig(max_tokens=50_000)
    manager = AdvancedContextManager(max_tokens=8_000, compression_mode="truncate", compression_config=config)
    assert (manager.max_tokens, manager.config.strategy) == (8_000, CompressionMode.TRUNCATE)
    assert (config.max_tokens, config.strategy) == (50_000, CompressionMode.EXTRACT)  # the caller's is untouched
    assert AdvancedContextManager(12_000).max_tokens == 12_000  # v2.0 positional max_tokens


def test_it_uses_a_given_llm_summarizer_only_as_the_config_says() -> None:
    with_llm = AdvancedContextManager(llm_summarizer=lambda prompt: "summary")
    assert with_llm.config.enable_llm_summarization and with_llm.config.llm_summarization_threshold == 0
    assert with_llm.llm_compressor is with_llm.summarizer and with_llm.summarizer.name == "llm"
    configured = AdvancedContextManager(compression_config=ContextCompressionConfig(), llm_summarizer=lambda prompt: "summary")
    assert configured.config.enable_llm_summarization is False and configured.llm_compressor is None
    assert AdvancedContextManager().llm_compressor is None
    extractive = ExtractiveSummarizer(len)
    assert AdvancedContextManager(llm_summarizer=extractive).summarizer is extractive  # a Summarizer as it is
