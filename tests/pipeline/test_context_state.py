"""The stateful form of the context managers (add_message and friends) and the list
compress returns, on the real token counter and compression."""

from __future__ import annotations

import pickle

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from pipeline import (
    AdvancedContextManager,
    BasicContextManager,
    CompressedMessages,
    CompressionMode,
    CompressionResult,
    MessageImportance,
)
from tests.pipeline.conversations import COUNTER, MODEL, conversation, tokens


def advanced(max_tokens: int = 3000, **kwargs):
    return AdvancedContextManager(max_tokens=max_tokens, token_counter=COUNTER, model=MODEL, **kwargs)


def test_it_refuses_a_malformed_message_and_stores_nothing():
    manager = advanced()
    manager.add_message({"role": "user", "content": "hi"})
    for bad in ({"content": "no role"}, {"role": "wizard", "content": "x"}, {"role": "user", "content": 42}, "text", None):
        with pytest.raises((ValueError, TypeError)):
            manager.add_message(bad)
    assert manager.get_messages() == [{"role": "user", "content": "hi"}]


def test_it_refuses_bad_importance_and_round_ids():
    manager = advanced()
    with pytest.raises(ValueError):
        manager.add_message({"role": "user", "content": "hi"}, importance=9)
    with pytest.raises(TypeError):
        manager.add_message({"role": "user", "content": "hi"}, round_id=7)
    assert manager.get_messages() == []
    manager.add_message({"role": "user", "content": "hi"}, importance=1)  # the enum's value reads
    assert manager._messages[0].importance is MessageImportance.CRITICAL


def test_it_compresses_only_past_the_threshold_and_keeps_every_result():
    manager = advanced(max_tokens=3000)
    messages = conversation(rounds=12)
    running, first_over = 0, None
    for index, message in enumerate(messages):
        running += tokens([message])
        if running > 3000 * 0.8:
            first_over = index
            break
    assert first_over is not None
    for message in messages[:first_over]:
        manager.add_message(message)
    assert manager.last_compression is None and manager.get_messages() == messages[:first_over]
    manager.add_message(messages[first_over])
    assert manager.last_compression is not None and len(manager.get_messages()) < first_over + 1
    for message in messages[first_over + 1 :]:
        manager.add_message(message)
    result = manager.last_compression
    assert isinstance(result, CompressionResult) and result.target_met
    assert manager.total_tokens == tokens(manager.get_messages()) <= 3000 * 0.8
    assert manager.get_messages()[0] == messages[0]  # the system message is never dropped
    usage = manager.get_token_usage()
    assert usage["total_tokens"] == manager.total_tokens and usage["threshold_tokens"] == 2400
    assert manager.should_compress() is False


def test_it_keeps_langchain_messages_as_they_are():
    manager = AdvancedContextManager(
        max_tokens=1500, compression_mode=CompressionMode.SUMMARIZE, token_counter=COUNTER, model=MODEL
    )
    manager.add_message(SystemMessage("You are an analyst."), MessageImportance.LOW)
    for r in range(15):
        manager.add_message(HumanMessage(f"question {r} " + "about sales " * 20), round_id=f"r{r}")
        manager.add_message(AIMessage(f"answer {r} " + "it grew " * 20), round_id=f"r{r}")
    history = manager.get_compressed_messages()
    assert isinstance(history[0], SystemMessage) and history[0].content == "You are an analyst."
    summaries = [m for m in history if isinstance(m, SystemMessage) and m.additional_kwargs.get("summary_id")]
    assert summaries and summaries[0].content.startswith("[Conversation summary:")
    assert manager.total_tokens == tokens(history)


def test_it_clears_the_stored_context():
    manager = BasicContextManager(max_tokens=1000, token_counter=COUNTER, model=MODEL)
    manager.add_message({"role": "user", "content": "hi"})
    manager.clear()
    assert manager.get_messages() == [] and manager.total_tokens == 0 and manager.last_compression is None


def test_it_returns_a_list_that_carries_the_result_and_pickles():
    messages = conversation(rounds=6)
    compressed = advanced().compress(messages, target_tokens=tokens(messages) // 2)
    assert type(compressed) is CompressedMessages and isinstance(compressed, list)
    assert compressed.result.messages_after == len(compressed) < len(messages)
    copy = pickle.loads(pickle.dumps(compressed))
    assert list(copy) == list(compressed) and copy.result == compressed.result
    assert CompressedMessages([1, 2]).result is None
