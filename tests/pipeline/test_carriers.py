import pytest
from pydantic import ValidationError

from pipeline import (
    ContentBlock,
    ContentBlockType,
    MessageType,
    OutputLevel,
    StandardMessage,
    ToolExecutionResult,
    ToolInvocationRequest,
)


def conversation_turn():
    return StandardMessage(
        role=MessageType.ASSISTANT,
        content=[
            ContentBlock(type=ContentBlockType.THINKING, thinking="need data"),
            ContentBlock(type=ContentBlockType.TEXT, text="Let me look."),
            ContentBlock(type=ContentBlockType.TOOL_USE, id="call_1", name="search", input={"q": "扬州"}),
        ],
    )


def test_it_round_trips_a_message_through_the_debug_dict():
    message = conversation_turn()
    data = message.to_debug_dict()
    assert data["role"] == "assistant"
    assert data["content"][2] == {
        "type": "tool_use", "id": "call_1", "name": "search", "input": {"q": "扬州"}, "is_error": False
    }
    assert StandardMessage.from_dict(data) == message


def test_it_reads_string_content_as_one_text_block():
    message = StandardMessage.from_dict({"role": "user", "content": "hello"})
    assert message.content == [ContentBlock(type="text", text="hello")]


def test_it_converts_a_successful_result_to_a_tool_result_block():
    result = ToolExecutionResult.from_raw_data("call_1", [1, 2], OutputLevel.BRIEF)
    block = ContentBlock.from_tool_result(result)
    assert (block.type, block.tool_use_id, block.content, block.is_error) == (
        ContentBlockType.TOOL_RESULT, "call_1", "Found 2 items", False
    )
    message = StandardMessage.from_tool_result(result)
    assert message.role is MessageType.USER
    assert message.to_debug_dict() == result.to_llm_message()


def test_it_carries_failures_as_error_blocks():
    result = ToolExecutionResult(
        tool_call_id="call_2", observation="", success=False, error_type="not_found", error_message="gone"
    )
    block = ContentBlock.from_tool_result(result)
    assert block.is_error and block.content.startswith("Operation failed.")
    assert StandardMessage.from_tool_result(result).to_debug_dict() == result.to_llm_message()


def test_it_makes_a_tool_use_block_from_a_request():
    req = ToolInvocationRequest(tool_call_id="call_3", tool_name="search", parameters={"q": 1})
    assert ContentBlock.from_tool_request(req).model_dump(exclude_none=True) == {
        "type": ContentBlockType.TOOL_USE, "id": "call_3", "name": "search", "input": {"q": 1}, "is_error": False
    }


@pytest.mark.parametrize(
    "data",
    [
        None,
        "user: hi",
        [],
        {"role": "robot", "content": []},
        {"role": "user"},
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "user", "content": [{"type": "text"}]},  # a text block without text
        {"role": "user", "content": [{"type": "tool_use", "id": "x"}]},  # no name
        {"role": "user", "content": [{"type": "tool_result", "content": "x"}]},  # no tool_use_id
        {"role": "user", "content": [{"type": "text", "text": "x", "evil": 1}]},
        {"role": "user", "content": [{"type": "tool_use", "id": "", "name": "n"}]},
        {"role": "user", "content": [{"type": "tool_use", "id": "i", "name": "n", "input": "rm -rf"}]},
        {"role": "user", "content": [{"type": "text", "text": "x"}] * 1001},  # oversized
        {"role": "user", "content": [], "timestamp": "now"},
    ],
)
def test_it_refuses_junk_with_a_validation_error(data):
    with pytest.raises(ValidationError):
        StandardMessage.from_dict(data)


def test_it_names_what_a_block_is_missing():
    with pytest.raises(ValidationError, match="a tool_use block needs id, name"):
        ContentBlock(type="tool_use")
