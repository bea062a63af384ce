"""ConversationRound / MultiRoundConversation beyond the design's examples: token
counting, compression through the library, hostile input."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline import CompressionMode, ConversationRound, MultiRoundConversation, ToolInvocationRequest
from tests.pipeline.conversations import COUNTER, MODEL, tokens


def round_(n: int, words: int = 30, **extra) -> ConversationRound:
    return ConversationRound(
        user_message=f"question {n} " + "about sales by region " * words,
        tool_calls=[{"id": f"call_{n}", "name": "query_database", "args": {"n": n}}],  # a LangChain tool call
        tool_observations=[f"| north | {n} |\n" * words],
        final_answer=f"answer {n} " + "it grew " * words,
        **extra,
    )


def test_it_reads_langchain_tool_calls_as_invocation_requests():
    r = round_(1)
    assert r.tool_calls == [ToolInvocationRequest(tool_call_id="call_1", tool_name="query_database", parameters={"n": 1})]


def test_it_counts_each_added_round_with_the_counter():
    conversation = MultiRoundConversation(user_id="u1")
    added = conversation.add_round(round_(1), model=MODEL, token_counter=COUNTER)
    assert added.conversation_id == conversation.conversation_id
    assert added.tokens_used == tokens(conversation._round_to_messages(added))
    given = conversation.add_round(round_(2, tokens_used=7))
    assert given.tokens_used == 7  # a given count is kept
    assert conversation.total_tokens() == added.tokens_used + 7


def test_it_compresses_the_history_with_the_library():
    conversation = MultiRoundConversation(user_id="u1", context_window_limit=4000)
    for n in range(10):
        conversation.add_round(round_(n), model=MODEL, token_counter=COUNTER)
    full = conversation._get_full_history()
    compressed = conversation.compress_history(target_tokens=1500, mode=CompressionMode.EXTRACT)
    assert compressed.result.tokens_before == tokens(full) and compressed.result.target_met
    assert compressed[-1] == full[-1]  # the latest answer stays
    # tool_use / tool_result pairs are kept or dropped together
    ids = [b["id"] for m in compressed if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for m in compressed if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"]
    assert ids == results


def test_it_cuts_long_requests_in_round_summaries_and_marks_the_cut():
    conversation = MultiRoundConversation(user_id="u1")
    short = conversation._create_round_summary(ConversationRound(user_message="short one"))
    long = conversation._create_round_summary(ConversationRound(user_message="x" * 500, final_answer="y" * 500))
    assert "  Request: short one" in short.splitlines() and "..." not in short
    assert "  Request: " + "x" * 100 + "..." in long.splitlines()
    assert "  Answer: " + "y" * 100 + "..." in long.splitlines()


@pytest.mark.parametrize(
    "fields",
    [
        {},  # no user_message
        {"user_message": "hi", "tokens_used": -1},
        {"user_message": "hi", "status": "exploded"},
        {"user_message": "hi", "tool_calls": [{"id": "", "name": "t", "args": {}}]},
        {"user_message": "hi", "tool_calls": "not a list"},
        {"user_message": "hi", "round_id": ""},
    ],
)
def test_it_refuses_malformed_rounds(fields):
    with pytest.raises(ValidationError):
        ConversationRound(**fields)


@pytest.mark.parametrize(
    "fields", [{}, {"user_id": "u", "context_window_limit": 0}, {"user_id": "u", "compression_threshold": 1.5}]
)
def test_it_refuses_malformed_conversations(fields):
    with pytest.raises(ValidationError):
        MultiRoundConversation(**fields)


def test_it_refuses_adding_something_else_than_a_round():
    with pytest.raises(TypeError):
        MultiRoundConversation(user_id="u").add_round({"user_message": "hi"})
