"""Reading messages for compression (pipeline._messages): every shape (dicts,
Claude-style blocks, LangChain), priorities in the v2.1 order, tool call/result
pairing, counting each message once, and malformed input refused clearly. Observed
through AdvancedContextManager, counted with the real DynamicTokenCounter."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, FunctionMessage, HumanMessage, SystemMessage, ToolMessage

from pipeline import AdvancedContextManager, ContextCompressionConfig, MessageAction, MessagePriority
from pipeline._messages import MessageAnalyzer, group_units, replace_slot, text_slots
from tests.pipeline.conversations import COUNTER, MODEL, call, conversation, manager, tokens

P = MessagePriority
A = MessageAction


# ------------------------------------------------------------------- priorities


def test_it_classifies_dict_messages_in_the_v21_order() -> None:
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "", "tool_calls": [call("a"), call("b"), call("c"), call("d")]},
        {"role": "tool", "tool_call_id": "a", "content": "rows", "status": "error"},
        {"role": "tool", "tool_call_id": "b", "content": "rows", "is_error": True},
        {"role": "tool", "tool_call_id": "c", "content": "Operation failed.\nError Type: Timeout"},
        {"role": "tool", "tool_call_id": "d", "content": "| east | 1200 |"},
        {"role": "assistant", "content": "East leads."},
        {"role": "assistant", "content": "debug dump", "verbose": True},
        {"role": "assistant", "content": "debug dump", "metadata": {"verbose": True}},
        {"role": "tool", "name": "log", "content": "fetched page 3"},
    ]
    _, result = manager().compress_with_result(messages, target_tokens=10_000)
    assert [c.priority for c in result.changes] == [
        P.CRITICAL, P.HIGH, P.HIGH, P.HIGH, P.HIGH, P.HIGH, P.MEDIUM, P.MEDIUM, P.LOW, P.LOW, P.LOW,
    ]
    assert result.changes[0].reason == "system message: never dropped"
    assert result.changes[2].tool_call_ids == ["a", "b", "c", "d"]
    assert result.changes[6].tool_call_ids == ["d"]


def test_it_classifies_langchain_messages() -> None:
    messages = [
        SystemMessage("rules"),
        HumanMessage("question"),
        AIMessage("", tool_calls=[{"name": "q", "args": {}, "id": "a"}, {"name": "q", "args": {}, "id": "b"}]),
        ToolMessage("timeout", tool_call_id="a", status="error"),
        ToolMessage("rows", tool_call_id="b"),
        AIMessage("East leads."),
        AIMessage("debug", additional_kwargs={"verbose": True}),
        AIMessage("debug", name="log"),
    ]
    _, result = manager().compress_with_result(messages, target_tokens=10_000)
    assert [c.priority for c in result.changes] == [P.CRITICAL, P.HIGH, P.HIGH, P.HIGH, P.MEDIUM, P.MEDIUM, P.LOW, P.LOW]
    assert [c.role for c in result.changes][:5] == ["system", "user", "assistant", "tool", "tool"]


def test_it_classifies_claude_style_blocks() -> None:
    messages = [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": [{"type": "text", "text": "Querying."}, {"type": "tool_use", "id": "t1", "name": "sql", "input": {"q": 1}}, {"type": "tool_use", "id": "t2", "name": "sql", "input": {"q": 2}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "timeout", "is_error": True}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "rows"}]}]},
    ]
    _, result = manager().compress_with_result(messages, target_tokens=10_000)
    assert [c.priority for c in result.changes] == [P.HIGH, P.HIGH, P.HIGH, P.MEDIUM]
    assert "[tool call] sql" in result.changes[1].content_before
    assert result.changes[2].content_before == "[tool error] timeout"
    assert "tool result paired with call in message 1" in result.changes[3].reason


def test_it_lets_a_verbose_mark_demote_only_what_would_be_medium() -> None:
    messages = [
        {"role": "user", "content": "question", "verbose": True},
        {"role": "assistant", "content": "", "tool_calls": [call("a")], "verbose": True},
        {"role": "tool", "tool_call_id": "a", "content": "Operation failed.", "name": "log"},
        {"role": "assistant", "content": "thinking aloud", "verbose": True},
    ]
    _, result = manager().compress_with_result(messages, target_tokens=10_000)
    assert [c.priority for c in result.changes] == [P.HIGH, P.HIGH, P.HIGH, P.LOW]


def test_it_shows_a_langchain_tool_call_once_when_it_is_also_a_block() -> None:
    message = AIMessage(
        content=[{"type": "tool_use", "id": "t1", "name": "sql", "input": {"q": 1}}],
        tool_calls=[{"name": "sql", "args": {"q": 1}, "id": "t1"}],
    )
    _, result = manager().compress_with_result([message, ToolMessage("rows", tool_call_id="t1")], target_tokens=10_000)
    assert result.changes[0].content_before == '[tool call] sql({"q": 1})'
    assert result.changes[0].tool_call_ids == ["t1"]


# --------------------------------------------------------------------- pairing


def test_it_pairs_a_reused_call_id_with_the_nearest_call() -> None:
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [call("same")]},
        {"role": "tool", "tool_call_id": "same", "content": "old rows " * 100},
        {"role": "user", "content": "again please"},
        {"role": "assistant", "content": None, "tool_calls": [call("same")]},
        {"role": "tool", "tool_call_id": "same", "content": "new rows"},
    ]
    output, result = manager(keep_recent=0).compress_with_result(messages, target_tokens=tokens(messages[2:]), mode="extract")
    assert output == messages[2:]
    assert "paired with call in message 3" in result.changes[4].reason


def test_it_keeps_an_already_orphaned_result_as_its_own_unit() -> None:
    messages = [
        {"role": "tool", "tool_call_id": "gone", "content": "rows " * 50},
        {"role": "user", "content": "next question"},
    ]
    output, result = manager().compress_with_result(messages, target_tokens=tokens(messages[1:]), mode="extract")
    assert [c.action for c in result.changes] == [A.DROPPED, A.KEPT]
    assert "answers call gone that is not in this list" in result.changes[0].reason


def test_it_groups_a_call_and_its_results_into_one_unit_without_a_manager() -> None:
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "assistant", "content": None, "tool_calls": [call("e"), call("w")]},
        {"role": "tool", "tool_call_id": "w", "content": "west"},
        {"role": "user", "content": "and?"},
        {"role": "tool", "tool_call_id": "e", "content": "east"},
    ]
    kind, infos = MessageAnalyzer(COUNTER, MODEL).analyse(messages)
    units, notes = group_units(infos)
    assert kind == "dict"
    assert [u.members for u in units] == [[0], [1, 2, 4], [3]]
    assert units[0].protected and not units[1].protected
    assert units[1].tokens == sum(infos[i].tokens for i in (1, 2, 4))
    assert notes[1] == "tool call paired with its results in messages 2, 4"


def test_it_edits_a_copy_of_nested_block_content() -> None:
    content = [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "long rows"}]}]
    ((path, text),) = text_slots(content)
    assert (path, text) == ((0, "content", 0, "text"), "long rows")
    edited = replace_slot(content, path, "short")
    assert edited[0]["content"][0]["text"] == "short"
    assert content[0]["content"][0]["text"] == "long rows"


# -------------------------------------------------------------------- counting


def test_it_counts_each_message_once_across_compressions() -> None:
    class CountingCounter:  # a spy around the real counter
        def __init__(self) -> None:
            self.calls = 0

        def count_message_tokens(self, message: Any, model: str) -> int:
            self.calls += 1
            return COUNTER.count_message_tokens(message, model)

        def count_tokens(self, text: str, model: str) -> int:
            return COUNTER.count_tokens(text, model)

    spy = CountingCounter()
    ctx = AdvancedContextManager(ContextCompressionConfig(), token_counter=spy, model=MODEL)
    messages = conversation(10)
    ctx.compress(messages, target_tokens=tokens(messages) // 2)
    assert spy.calls == len(messages)
    grown = messages + [{"role": "user", "content": "one more"}]
    ctx.compress(grown, target_tokens=tokens(grown) // 2)
    assert spy.calls == len(messages) + 1
    copies = [dict(m) for m in grown]  # equal content, new objects: still cached
    ctx.compress(copies, target_tokens=tokens(grown) // 2)
    assert spy.calls == len(messages) + 1


def test_it_recounts_a_message_whose_content_changed() -> None:
    ctx = manager()
    messages = [{"role": "user", "content": "short"}]
    before = ctx.count_tokens(messages)
    messages[0]["content"] = "much longer now " * 50
    assert ctx.count_tokens(messages) == tokens(messages) > before
    assert ctx.count_tokens([{"role": "assistant", "content": None}]) != ctx.count_tokens([{"role": "assistant", "content": "null"}])


# -------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"content": "no role"}], "message 0: missing 'role'"),
        ([{"role": "user", "content": "ok"}, {"role": "wizard", "content": "x"}], "message 1: unknown role 'wizard'"),
        ([{"role": 7, "content": "x"}], "unknown role 7"),
        ([{"role": "user", "content": 42}], "content must be a string, a list of blocks or None, not int"),
        ([{"role": "user", "content": {"text": "x"}}], "not dict"),
        ([{"role": "user", "content": [1, 2]}], "every content block"),
        ([{"role": "user", "content": [{"text": "no type"}]}], "every content block"),
        ([{"role": "assistant", "content": "", "tool_calls": "c1"}], "tool_calls must be a list"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"id": 5}]}], "tool call id must be a string"),
        ([{"role": "tool", "content": "x", "tool_call_id": 5}], "tool_call_id must be a string"),
        (["just a string"], "message 0: expected a dict or a LangChain message, not str"),
        ([{"role": "user", "content": "x"}, HumanMessage("y")], "mix dicts and LangChain"),
        ([FunctionMessage(content="x", name="f")], "unsupported message type FunctionMessage"),
        ("user: hello", "messages must be a list"),
        ({"role": "user", "content": "x"}, "messages must be a list"),
    ],
)
def test_it_refuses_malformed_messages_clearly(messages: Any, expected: str) -> None:
    with pytest.raises(ValueError) as raised:
        manager().compress(messages, target_tokens=100)
    assert expected in str(raised.value)


def test_it_cuts_a_hostile_role_in_the_error() -> None:
    with pytest.raises(ValueError) as raised:
        manager().compress([{"role": "x" * 100_000, "content": "y"}], target_tokens=100)
    assert len(str(raised.value)) < 200


def test_it_refuses_a_circular_message() -> None:
    loop: dict = {"role": "user", "content": "x"}
    loop["extra"] = loop
    with pytest.raises(ValueError):
        manager().compress([loop], target_tokens=100)
