"""Skill activation: the request and its chain (cycles, depth), the activation
stack, and the activator with its context modifier, messages and record."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline import (
    ContextModifier,
    SkillActivationRecord,
    SkillActivationRequest,
    SkillActivationStack,
    SkillActivator,
    SkillLoader,
    parse_record,
)
from pipeline._exceptions import CircularDependencyError, PipelineError, SkillError
from pipeline._tokens import DynamicTokenCounter
from tests.pipeline.skill_helpers import write_skill


# --- activation request --------------------------------------------------------------


def test_it_allows_nesting_within_depth_and_without_cycles() -> None:
    request = SkillActivationRequest(skill_name="a")
    assert request.can_activate_nested("b")
    assert not request.can_activate_nested("a")  # direct self-activation
    nested = request.create_nested_request("b", "act-b")
    assert nested.activation_chain == ["a"] and nested.activation_depth == 1
    assert nested.activation_id == "act-b" and nested.load_level == 2
    assert not nested.can_activate_nested("a")


def test_it_refuses_a_skill_activating_itself() -> None:
    with pytest.raises(CircularDependencyError, match="Circular dependency detected: a → a$"):
        SkillActivationRequest(skill_name="a").create_nested_request("a")


def test_it_refuses_an_indirect_cycle_with_the_full_path() -> None:
    c = SkillActivationRequest(skill_name="a").create_nested_request("b").create_nested_request("c")
    with pytest.raises(CircularDependencyError, match="Circular dependency detected: a → b → c → a$"):
        c.create_nested_request("a")
    with pytest.raises(CircularDependencyError, match="a → b → c → b$"):
        c.create_nested_request("b")


def test_it_refuses_nesting_past_max_depth_as_a_depth_error() -> None:
    request = SkillActivationRequest(skill_name="s0", max_depth=2)
    deepest = request.create_nested_request("s1").create_nested_request("s2")
    assert deepest.activation_depth == 2
    assert not deepest.can_activate_nested("s3")
    with pytest.raises(SkillError, match=r"depth \(2\) exceeded: s0 → s1 → s2 → s3") as caught:
        deepest.create_nested_request("s3")
    assert not isinstance(caught.value, CircularDependencyError)


def test_it_keeps_the_nested_load_level_unless_told(loader: SkillLoader) -> None:
    request = SkillActivationRequest(skill_name="a", load_level=1)
    assert request.create_nested_request("b").load_level == 1
    assert request.create_nested_request("b", load_level=3).load_level == 3


@pytest.mark.parametrize(
    "fields",
    [
        {"skill_name": "../x"},
        {"skill_name": "A"},
        {"skill_name": "a", "load_level": 4},
        {"skill_name": "a", "load_level": 0},
        {"skill_name": "a", "activation_depth": 1},  # chain shorter than depth
        {"skill_name": "a", "activation_depth": 1, "activation_chain": ["a"]},  # already a cycle
        {"skill_name": "a", "activation_depth": 4, "activation_chain": ["b", "c", "d", "e"]},
        {"skill_name": "a", "activation_depth": 1, "activation_chain": ["../etc"]},
        {"skill_name": "a", "activation_id": "id\nforged"},
        {"skill_name": "a", "activation_id": "x" * 201},
        {"skill_name": "a", "unexpected": 1},
        {"skill_name": "a", "resources": ["r"] * 65},
    ],
)
def test_it_refuses_malformed_requests(fields: dict) -> None:
    with pytest.raises(ValidationError):
        SkillActivationRequest(**fields)


def test_it_refuses_an_invalid_nested_name() -> None:
    with pytest.raises(SkillError, match="invalid skill name"):
        SkillActivationRequest(skill_name="a").create_nested_request("../../etc")


# --- activation stack ----------------------------------------------------------------


def test_it_tracks_the_chain_as_a_stack() -> None:
    stack = SkillActivationStack()
    stack.push("a", "1")
    stack.push("b", "2")
    assert stack.current_chain == ["a", "b"] and stack.depth == 2 and len(stack) == 2
    stack.pop("b", "2")
    stack.push("c", "3")  # b is done: the chain is a call stack, not a history
    assert stack.current_chain == ["a", "c"]
    stack.pop("c")
    stack.pop("a", "1")
    assert stack.depth == 0


def test_it_refuses_a_pop_that_is_not_the_top() -> None:
    stack = SkillActivationStack()
    stack.push("a", "1")
    stack.push("b", "2")
    with pytest.raises(SkillError, match="mismatch"):
        stack.pop("a", "1")
    with pytest.raises(SkillError, match="mismatch"):
        stack.pop("b", "wrong-id")
    assert stack.current_chain == ["a", "b"]


def test_it_refuses_a_pop_from_an_empty_stack() -> None:
    with pytest.raises(SkillError, match="no skill is active"):
        SkillActivationStack().pop("a")


def test_it_refuses_pushing_a_cycle_or_past_the_depth() -> None:
    stack = SkillActivationStack(max_depth=1)
    stack.push("a", "1")
    with pytest.raises(CircularDependencyError, match="a → a"):
        stack.push("a", "2")
    stack.push("b", "2")
    with pytest.raises(SkillError, match=r"depth \(1\) exceeded"):
        stack.push("c", "3")
    assert stack.current_chain == ["a", "b"]


def test_it_pops_on_exit_even_when_the_activation_fails() -> None:
    stack = SkillActivationStack()
    with pytest.raises(RuntimeError):
        with stack.activate("a") as outer_id:
            assert outer_id
            with stack.activate("b", "act-b"):
                assert stack.current_chain == ["a", "b"]
                raise RuntimeError("tool failed")
    assert stack.depth == 0


def test_it_builds_a_request_from_the_stack() -> None:
    stack = SkillActivationStack(max_depth=2)
    with stack.activate("a"), stack.activate("b"):
        request = stack.request_for("c", load_level=1)
        assert request.activation_chain == ["a", "b"] and request.activation_depth == 2
        with pytest.raises(CircularDependencyError):
            stack.request_for("a")
        with stack.activate("c"):
            with pytest.raises(SkillError, match="exceeded"):
                stack.request_for("d")


def test_it_raises_only_pipeline_errors_for_misuse() -> None:
    assert issubclass(CircularDependencyError, SkillError)
    assert issubclass(SkillError, PipelineError)


# --- activator, modifier, messages, record -------------------------------------------


class FakeClock:
    def __init__(self, step: float) -> None:
        self.now = 100.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_it_builds_a_context_modifier_from_frontmatter(loader: SkillLoader) -> None:
    modifier = ContextModifier.from_metadata(loader.load_metadata("sales-report"))
    assert modifier.allowed_tools == frozenset({"query_database", "run_python"})
    assert modifier.model == "claude-3-5-sonnet"
    assert modifier.allows("run_python") and not modifier.allows("delete_table")
    assert ContextModifier.from_metadata(loader.load_metadata("quick-note")).allows("anything")


def test_it_activates_at_level_1_with_metadata_only(loader: SkillLoader) -> None:
    result = SkillActivator(loader).activate(SkillActivationRequest(skill_name="quick-note", load_level=1))
    assert result.success and result.error is None
    assert [m.type for m in result.messages] == ["metadata"]
    assert result.tokens_loaded == loader.load_metadata("quick-note").tokens
    assert result.context_modifier.allowed_tools is None


def test_it_injects_the_body_as_a_hidden_meta_message_at_level_2(loader: SkillLoader) -> None:
    result = SkillActivator(loader).activate(SkillActivationRequest(skill_name="sales-report"))
    body = loader.load_full("sales-report")
    assert result.tokens_loaded == body.tokens + body.metadata.tokens
    messages = result.to_llm_messages()
    assert messages[0] == {"role": "user", "content": result.messages[0].content}
    assert "isMeta" not in messages[0]
    instruction = messages[1]
    assert instruction["content"] == body.body
    assert instruction["isMeta"] is True and instruction["additional_kwargs"] == {"isMeta": True}
    permissions = messages[-1]
    assert permissions["isMeta"] is True and "query_database, run_python" in permissions["content"]
    assert result.context_modifier.allowed_tools == frozenset({"query_database", "run_python"})


def test_it_loads_requested_resources_at_level_3(loader: SkillLoader) -> None:
    request = SkillActivationRequest(
        skill_name="sales-report", load_level=3, resources=["references/report_format.md", "scripts/summarise.py"]
    )
    result = SkillActivator(loader).activate(request)
    assert result.success
    assert result.resources == ["references/report_format.md", "scripts/summarise.py"]
    resource_messages = [m for m in result.messages if m.type == "resource"]
    assert len(resource_messages) == 2 and all(m.visibility == "hidden" for m in resource_messages)
    assert "def summarise(rows)" in resource_messages[1].content
    full = loader.load_full("sales-report")
    expected = full.tokens + full.metadata.tokens + sum(
        loader.load_resource("sales-report", p).tokens for p in request.resources
    )
    assert result.tokens_loaded == expected


def test_it_lists_available_resources_at_level_3_when_none_are_named(loader: SkillLoader) -> None:
    result = SkillActivator(loader).activate(SkillActivationRequest(skill_name="sales-report", load_level=3))
    index = [m for m in result.messages if m.type == "resource"][0].content
    assert "assets/template.csv" in index and "references/report_format.md" in index
    assert result.resources == []


@pytest.mark.parametrize(
    ("request_fields", "problem"),
    [
        ({"skill_name": "no-such-skill"}, "no skill named"),
        ({"skill_name": "sales-report", "load_level": 3, "resources": ["../quick-note/SKILL.md"]}, "'..'"),
        ({"skill_name": "sales-report", "load_level": 3, "resources": ["references/none.md"]}, "no resource"),
    ],
)
def test_it_returns_a_failed_result_instead_of_raising(
    loader: SkillLoader, request_fields: dict, problem: str
) -> None:
    result = SkillActivator(loader).activate(SkillActivationRequest(**request_fields))
    assert result.success is False
    assert problem in (result.error or "")
    assert result.messages == [] and result.tokens_loaded == 0


def test_it_returns_a_failed_result_for_a_malformed_skill(skills: Path, counter: DynamicTokenCounter) -> None:
    write_skill(skills, "broken", "---\nname: wrong\ndescription: d\n---\n")
    activator = SkillActivator(SkillLoader(skills, token_counter=counter))
    result = activator.activate(SkillActivationRequest(skill_name="broken", load_level=1))
    assert not result.success and "does not match its folder" in (result.error or "")


def test_it_measures_duration_with_fake_clock(loader: SkillLoader) -> None:
    activator = SkillActivator(loader, clock=FakeClock(step=0.25))
    result = activator.activate(SkillActivationRequest(skill_name="quick-note"))
    assert result.duration_ms == pytest.approx(250.0)
    failed = activator.activate(SkillActivationRequest(skill_name="missing"))
    assert failed.duration_ms == pytest.approx(250.0)


def test_it_produces_a_skill_activation_record(loader: SkillLoader) -> None:
    parent = SkillActivationRequest(skill_name="sales-report", activation_id="act-1")
    nested = parent.create_nested_request("data-cleaning", "act-2", load_level=3)
    nested = nested.model_copy(update={"resources": ["references/date_formats.md"]})
    result = SkillActivator(loader).activate(nested)
    record = result.to_record("conv-1", round_id="round-2")
    assert isinstance(record, SkillActivationRecord)
    assert (record.skill_name, record.activation_id, record.load_level) == ("data-cleaning", "act-2", 3)
    assert record.depth == 1 and record.chain == ["sales-report"]
    assert record.tokens_loaded == result.tokens_loaded > 0
    assert record.resources == ["references/date_formats.md"]
    assert record.conversation_id == "conv-1" and record.round_id == "round-2"
    again = parse_record(record.model_dump(mode="json"))
    assert again == record


def test_it_records_a_failed_activation(loader: SkillLoader) -> None:
    result = SkillActivator(loader).activate(SkillActivationRequest(skill_name="missing"))
    record = result.to_record("conv-1")
    assert record.success is False and "no skill named" in (record.error or "")
    assert parse_record(record.model_dump(mode="json")).success is False
