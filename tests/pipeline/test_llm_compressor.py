"""The v2.0 LLMCompressor and CompressionCostEstimate: the model is the edge (fakes
named so); every failure falls back to the extracted key facts."""

from __future__ import annotations

import asyncio
import threading

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from pipeline import CompressionCostEstimate, CompressionMode, LLMCompressor

MESSAGES = [
    {"role": "user", "content": "Revenue by region for March"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "q", "args": {}}]},
    {"role": "assistant", "content": "East leads with 40%."},
]


def summarize(compressor: LLMCompressor) -> str:
    return asyncio.run(compressor.summarize_messages(MESSAGES, ["decisions"]))


def test_it_falls_back_when_the_fake_model_raises(caplog):
    def broken(prompt):
        raise ConnectionError("provider down")

    with caplog.at_level("ERROR", logger="pipeline._llm_compressor"):
        text = summarize(LLMCompressor(llm=broken))
    assert text.splitlines() == ["用户: Revenue by region for March...", "[工具调用 x1]", "助手: East leads with 40%...."]
    assert "ConnectionError" in caplog.text and "provider down" not in caplog.text


def test_it_falls_back_when_the_fake_model_is_too_slow():
    release = threading.Event()

    def slow(prompt):
        release.wait(5)
        return "too late"

    try:
        assert summarize(LLMCompressor(timeout_ms=50, llm=slow)).startswith("用户:")
    finally:
        release.set()


def test_it_falls_back_on_an_empty_answer_from_the_fake_model():
    assert summarize(LLMCompressor(llm=FakeListChatModel(responses=["   "]))).startswith("用户:")


def test_it_sends_the_latest_twenty_messages_cut_to_two_hundred_characters():
    prompts = []

    def capture(prompt):  # a fake model that records its prompt
        prompts.append(prompt)
        return "ok"

    many = [{"role": "user", "content": f"m{i} " + "z" * 500} for i in range(30)]
    assert asyncio.run(LLMCompressor(llm=capture).summarize_messages(many)) == "ok"
    assert "m9 " not in prompts[0] and "m10 " in prompts[0] and "z" * 201 not in prompts[0]


def test_it_says_so_when_there_is_nothing_to_summarise():
    assert asyncio.run(LLMCompressor().summarize_messages([])) == "[对话摘要不可用]"


@pytest.mark.parametrize(
    "kwargs", [{"llm": 42}, {"timeout_ms": 0}, {"timeout_ms": True}, {"max_summary_tokens": 0}, {"max_summary_tokens": 1.5}]
)
def test_it_refuses_bad_settings(kwargs):
    with pytest.raises((TypeError, ValueError)):
        LLMCompressor(**kwargs)


def test_it_estimates_costs_by_name_and_refuses_unknown_strategies():
    assert CompressionCostEstimate.estimate_cost("summarize", 2000) == pytest.approx(0.006)
    assert CompressionCostEstimate.estimate_cost(CompressionMode.TRUNCATE, 10**9) == 0
    with pytest.raises(ValueError):
        CompressionCostEstimate.estimate_cost("squash", 1000)
