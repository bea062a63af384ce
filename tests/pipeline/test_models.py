import datetime as dt
import hashlib
import json
import subprocess
import sys
from decimal import Decimal

import pytest
from pydantic import ValidationError

from pipeline import OutputLevel, ToolExecutionResult, ToolInvocationRequest
from pipeline._models import Payload

ROWS = [{"id": i, "name": f"user{i}"} for i in range(10)]


def request(**fields):
    return ToolInvocationRequest(**{"tool_call_id": "call_1", "tool_name": "search", **fields})


# --------------------------------------------------------------------------- idempotency key


def test_it_leaves_the_tool_call_id_out_of_the_key():
    a = request(tool_call_id="call_1", parameters={"q": "扬州"})
    b = request(tool_call_id="call_2", parameters={"q": "扬州"})
    assert a.get_or_generate_idempotency_key() == b.get_or_generate_idempotency_key()


def test_it_ignores_parameter_order_also_nested():
    a = request(parameters={"a": 1, "b": {"y": [1, {"q": 1, "p": 2}], "x": 2}})
    b = request(parameters={"b": {"x": 2, "y": [1, {"p": 2, "q": 1}]}, "a": 1})
    assert a.get_or_generate_idempotency_key() == b.get_or_generate_idempotency_key()


@pytest.mark.parametrize(
    "change",
    [
        {"tool_name": "other"},
        {"tool_version": "2.0.0"},
        {"parameters": {"q": "x"}},
        {"caller_id": "skill:report"},
        {"permission_level": "admin"},
    ],
)
def test_it_changes_the_key_with_each_component(change):
    assert request().get_or_generate_idempotency_key() != request(**change).get_or_generate_idempotency_key()


def test_it_is_the_sha256_of_the_canonical_json():
    key = request(parameters={"b": 1, "a": 2}).get_or_generate_idempotency_key()
    canonical = (
        '{"caller_id":"agent","parameters":{"a":2,"b":1},"permission_level":"default",'
        '"tool_name":"search","tool_version":"1.0.0"}'
    )
    assert key == hashlib.sha256(canonical.encode()).hexdigest()


def test_it_returns_an_explicit_key():
    assert request(idempotency_key="mine").get_or_generate_idempotency_key() == "mine"


def test_it_keys_parameters_json_cannot_encode():
    a = request(parameters={"when": dt.date(2025, 1, 1), "ids": {3, 1}, "f": {5: Decimal("1.0")}})
    b = request(parameters={"f": {5: Decimal("1.0")}, "ids": {1, 3}, "when": dt.date(2025, 1, 1)})
    assert a.get_or_generate_idempotency_key() == b.get_or_generate_idempotency_key()


def test_it_builds_a_request_from_a_langchain_tool_call():
    req = ToolInvocationRequest.from_tool_call({"id": "call_9", "name": "search", "args": {"q": 1}}, caller_id="x")
    assert (req.tool_call_id, req.tool_name, req.parameters, req.caller_id) == ("call_9", "search", {"q": 1}, "x")


@pytest.mark.parametrize(
    "tool_call",
    [{"name": "search", "args": {}}, {"id": "", "name": "search"}, {"id": "c", "name": "x" * 201}],
)
def test_it_refuses_a_malformed_tool_call(tool_call):
    with pytest.raises(ValidationError):
        ToolInvocationRequest.from_tool_call(tool_call)


def test_it_refuses_a_tool_call_that_is_not_a_mapping():
    with pytest.raises(TypeError):
        ToolInvocationRequest.from_tool_call(["call_1", "search"])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- from_raw_data


def test_it_renders_at_the_requested_level_with_size_and_hash():
    result = ToolExecutionResult.from_raw_data("call_1", ROWS, OutputLevel.BRIEF)
    body = json.dumps(ROWS, ensure_ascii=False).encode()
    assert result.success and result.observation == "Found 10 items"
    assert result.data_size_bytes == len(body)
    assert result.data_hash == hashlib.sha256(body).hexdigest()
    assert result.artifact_id is None and result.data_summary is None


def test_it_measures_text_as_utf8():
    result = ToolExecutionResult.from_raw_data("call_1", "扬州", OutputLevel.FULL)
    assert result.data_size_bytes == 6 and result.observation == "扬州"


def test_it_keeps_full_inline_without_a_store():
    result = ToolExecutionResult.from_raw_data("call_1", ROWS, OutputLevel.FULL)
    assert json.loads(result.observation) == ROWS and result.artifact_id is None


def test_it_survives_unencodable_data():
    data = {"at": dt.datetime(2025, 1, 1), (1, 2): object()}
    result = ToolExecutionResult.from_raw_data("call_1", data, OutputLevel.FULL)
    assert json.loads(result.observation)["at"] == "2025-01-01T00:00:00"


def test_it_encodes_the_payload_once_for_hash_and_full():
    payload = Payload.of(ROWS)
    assert payload.content_type == "application/json"
    assert payload.full_json == payload.body.decode()
    assert Payload.of(b"\x00\x01").body == b"\x00\x01"
    assert Payload.of("text").content_type.startswith("text/plain")


# --------------------------------------------------------------------------- carriers


def failed(**fields):
    return ToolExecutionResult(
        tool_call_id="call_7",
        observation="",
        success=False,
        error_type="timeout",
        error_code="TIMEOUT",
        error_message="Tool execution timed out after 100ms",
        **fields,
    )


def test_it_formats_the_standard_error_observation_exactly():
    assert failed().format_error_observation() == (
        "Operation failed.\n\n"
        "Error Type: timeout\n"
        "Error Code: TIMEOUT\n"
        "Error Message: Tool execution timed out after 100ms\n\n"
        "Tool Call ID: call_7"
    )


def test_it_fills_in_unknowns_in_the_error_observation():
    result = ToolExecutionResult(tool_call_id="c", observation="", success=False)
    assert "Error Type: Unknown\nError Code: UNKNOWN\nError Message: An unknown error occurred" in (
        result.format_error_observation()
    )


def test_it_returns_the_observation_when_successful():
    ok = ToolExecutionResult(tool_call_id="c", observation="fine", success=True)
    assert ok.format_error_observation() == "fine"


def test_it_makes_a_langchain_tool_message():
    from langchain_core.messages import ToolMessage

    ok = ToolExecutionResult.from_raw_data("call_1", ROWS, OutputLevel.BRIEF).to_tool_message()
    assert isinstance(ok, ToolMessage)
    assert (ok.content, ok.tool_call_id, ok.status) == ("Found 10 items", "call_1", "success")
    bad = failed().to_tool_message()
    assert bad.status == "error" and bad.content.startswith("Operation failed.")


def test_it_makes_the_claude_code_tool_result():
    assert failed().to_llm_message() == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "call_7",
                "content": failed().format_error_observation(),
                "is_error": True,
            }
        ],
    }


def test_it_says_how_to_install_langchain_when_missing(tmp_path):
    # A real interpreter where langchain_core cannot be imported.
    blocker = tmp_path / "langchain_core"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    code = (
        "from pipeline import ToolExecutionResult\n"
        "r = ToolExecutionResult(tool_call_id='c', observation='o', success=True)\n"
        "try:\n    r.to_tool_message()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{tmp_path}:{_repo_root()}"},
        timeout=30,
    )
    assert "pip install pipeline-observatory[langchain]" in out.stdout, out.stderr


def _repo_root():
    import pipeline

    return str(__import__("pathlib").Path(pipeline.__file__).resolve().parent.parent)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_call_id": ""},
        {"tool_call_id": "x" * 257},
        {"artifact_id": "../../etc/passwd"},
        {"artifact_id": "artifact_/tmp/x"},
        {"data_size_bytes": -1},
        {"unknown": 1},
        {"warnings": ["w"] * 21},
    ],
)
def test_it_refuses_malformed_results(fields):
    with pytest.raises(ValidationError):
        ToolExecutionResult(**{"tool_call_id": "c", "observation": "o", "success": True, **fields})


@pytest.mark.parametrize("fields", [{"timeout_ms": 0}, {"tool_name": ""}, {"extra": 1}, {"output_level": "loud"}])
def test_it_refuses_malformed_requests(fields):
    with pytest.raises(ValidationError):
        request(**fields)


# --------------------------------------------------------------------------- artifacts


@pytest.fixture
def store(tmp_path):
    from pipeline._artifacts import ArtifactStore

    return ArtifactStore(tmp_path / "artifacts")


def test_it_stores_full_data_as_an_artifact(store, tmp_path):
    result = ToolExecutionResult.from_raw_data("call_1", ROWS, OutputLevel.FULL, store)
    assert result.artifact_id == f"artifact_{result.data_hash}"
    assert json.loads(store.retrieve(result.artifact_id)) == ROWS
    assert result.observation.startswith(f"Data stored as artifact: {result.artifact_id}\n")
    assert result.data_summary == "List with 10 items. First item keys: ['id', 'name']"
    assert str(tmp_path) not in result.observation and "/" not in result.observation


def test_it_stores_large_data_at_any_level(store):
    from pipeline._artifacts import THRESHOLD_BYTES

    big = "x" * THRESHOLD_BYTES  # exactly the threshold: stored
    result = ToolExecutionResult.from_raw_data("call_1", big, OutputLevel.BRIEF, store)
    assert result.artifact_id is not None and result.output_level is OutputLevel.BRIEF
    assert store.retrieve(result.artifact_id) == big.encode()
    assert len(result.observation) < 1000


def test_it_keeps_small_standard_data_inline(store):
    result = ToolExecutionResult.from_raw_data("call_1", ROWS, OutputLevel.STANDARD, store)
    assert result.artifact_id is None and store.list() == []


def test_it_stores_when_forced(store):
    result = ToolExecutionResult.from_raw_data("call_1", ROWS, OutputLevel.BRIEF, store, force_artifact=True)
    assert result.artifact_id is not None


def test_it_degrades_to_inline_when_the_store_refuses(tmp_path):
    from pipeline._artifacts import ArtifactStore

    tiny = ArtifactStore(tmp_path / "tiny", max_total_bytes=10)  # refuses anything bigger
    result = ToolExecutionResult.from_raw_data("call_1", ROWS, OutputLevel.FULL, tiny)
    assert result.success and result.artifact_id is None
    assert json.loads(result.observation) == ROWS
    assert result.warnings and result.warnings[0].startswith("artifact_store_failed: ArtifactError")
