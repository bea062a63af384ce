"""The scripted model: deterministic ids, recovery from failed calls, faults it announces."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pipeline.demo.model import Call, RoundScript, ScriptedModel, last_artifact_id
from pipeline.demo.scenarios import SCENARIOS, describe, scenario_for

FAILED = "Operation failed.\n\nError Type: not_found\nError Code: NOT_FOUND\nError Message: no file"


def _tool_message(call: dict[str, Any], content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def _script() -> RoundScript:
    return RoundScript(
        "Summarise the Q4 report.",
        [
            Call("file_reader", {"name": "q4_report.md"}, thought="Open it.",
                 on_error=Call("file_reader", {"name": "q3_report.md"}, thought="Use Q3.")),
            Call("calculator", {"expression": "1 + 1"}, output_level="brief", timeout_ms=900),
        ],
        lambda obs: f"Done with {len(obs)} observations.",
    )


def _ids(seed: str) -> list[str]:
    model = ScriptedModel()
    model.start_round(_script(), seed=seed)
    first = model.respond([{"role": "user", "content": "hi"}]).tool_calls[0]
    second = model.respond([_tool_message(first, "the report")]).tool_calls[0]
    return [first["id"], second["id"]]


def test_it_makes_the_same_ids_for_the_same_seed() -> None:
    assert _ids("conv-1:0") == _ids("conv-1:0")


def test_it_makes_other_ids_for_another_round() -> None:
    assert set(_ids("conv-1:0")).isdisjoint(_ids("conv-1:1"))


def test_it_makes_ids_shaped_like_a_providers() -> None:
    assert all(re.fullmatch(r"toolu_[0-9a-f]{24}", i) for i in _ids("x"))


def test_it_refuses_to_answer_before_a_round_starts() -> None:
    with pytest.raises(RuntimeError, match="start_round"):
        ScriptedModel().respond([])


def test_it_recovers_from_a_failed_call_with_its_plan() -> None:
    model = ScriptedModel()
    model.start_round(_script(), seed="s")
    first = model.respond([{"role": "user", "content": "go"}])
    call = first.tool_calls[0]
    recovery = model.respond([_tool_message(call, FAILED)])
    assert recovery.tool_calls[0]["name"] == "file_reader"
    assert recovery.tool_calls[0]["args"] == {"name": "q3_report.md"}
    assert recovery.thought == "Use Q3."
    # Then it carries on with its script.
    nxt = model.respond([_tool_message(recovery.tool_calls[0], "Q3 text")])
    assert nxt.tool_calls[0]["name"] == "calculator"


def test_it_skips_the_plan_when_the_call_succeeded() -> None:
    model = ScriptedModel()
    model.start_round(_script(), seed="s")
    call = model.respond([{"role": "user", "content": "go"}]).tool_calls[0]
    nxt = model.respond([_tool_message(call, "The Q4 report says ...")])
    assert nxt.tool_calls[0]["name"] == "calculator"


def test_it_ignores_a_failure_of_a_call_it_did_not_make() -> None:
    model = ScriptedModel()
    model.start_round(_script(), seed="s")
    model.respond([{"role": "user", "content": "go"}])
    nxt = model.respond([{"role": "tool", "tool_call_id": "toolu_forged", "content": FAILED}])
    assert nxt.tool_calls[0]["name"] == "calculator"


def test_it_passes_the_output_level_and_timeout_it_wants() -> None:
    model = ScriptedModel()
    model.start_round(_script(), seed="s")
    call = model.respond([]).tool_calls[0]
    turn = model.respond([_tool_message(call, "ok")])
    assert turn.options[turn.tool_calls[0]["id"]] == {"output_level": "brief", "timeout_ms": 900}


def test_it_writes_the_final_answer_from_the_observations() -> None:
    model = ScriptedModel()
    model.start_round(RoundScript("q", [], lambda obs: f"{len(obs)} seen"), seed="s")
    turn = model.respond([_tool_message({"id": "a"}, "x"), _tool_message({"id": "b"}, "y")])
    assert turn.final_answer == "2 seen" and not turn.tool_calls
    assert turn.input_tokens > 0 and turn.output_tokens > 0


def test_it_announces_the_faults_of_its_next_calls() -> None:
    model = ScriptedModel()
    model.start_round(RoundScript("q", [Call("web_search", {"query": "x"}, fault="rate_limit_once"), Call("calculator", {})]), seed="s")
    call = model.respond([]).tool_calls[0]
    assert model.faults == ["rate_limit_once"]
    model.respond([_tool_message(call, "ok")])
    assert model.faults == []


def test_it_builds_arguments_from_earlier_observations() -> None:
    artifact = "artifact_" + "ab" * 32
    model = ScriptedModel()
    model.start_round(RoundScript("q", [Call("file_reader", lambda obs: {"name": last_artifact_id(obs)})]), seed="s")
    turn = model.respond([_tool_message({"id": "a"}, f"Stored as {artifact}. Summary ...")])
    assert turn.tool_calls[0]["args"] == {"name": artifact}


def test_it_falls_back_to_a_placeholder_without_an_artifact() -> None:
    assert last_artifact_id(["nothing here"]) == "artifact_0000000000000000"


def test_it_cycles_through_every_scenario() -> None:
    keys = [scenario_for(i).key for i in range(2 * len(SCENARIOS))]
    assert keys[: len(SCENARIOS)] == keys[len(SCENARIOS):] == [s.key for s in SCENARIOS]
    assert len(set(keys)) == len(SCENARIOS)
    assert {"en", "zh"} == {s.language for s in SCENARIOS}
    assert "long_analysis" in describe()


def test_it_answers_from_what_it_read_though_a_compression_dropped_it_since() -> None:
    model = ScriptedModel()
    answers: list[Any] = []
    model.start_round(RoundScript("q", [Call("calculator", {"expression": "1 + 1"})],
                                  lambda obs: answers.append(obs) or "done"), seed="s")
    earlier = {"role": "tool", "tool_call_id": "call_earlier_round", "content": "from before"}
    call = model.respond([earlier, {"role": "user", "content": "q"}]).tool_calls[0]
    compressed = [{"role": "system", "content": "[Conversation summary]"}, _tool_message(call, "2")]
    assert model.respond(compressed).final_answer == "done"
    assert answers[0] == ["from before", "2"] and answers[0].this_round == ["2"]


def test_it_knows_when_its_own_result_was_summarised_before_it_read_it() -> None:
    model = ScriptedModel()
    answers: list[Any] = []
    model.start_round(RoundScript("q", [Call("calculator", {"expression": "1 + 1"})],
                                  lambda obs: answers.append(obs) or "done"), seed="s")
    model.respond([{"role": "tool", "tool_call_id": "call_earlier_round", "content": "from before"}])
    model.respond([{"role": "system", "content": "[Conversation summary: 3 earlier messages]"}])
    assert answers[0] == ["from before"] and answers[0].this_round == []
