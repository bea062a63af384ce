import socket

import pytest
from pydantic import BaseModel, ValidationError

from pipeline import ToolError, ToolErrorResponse, ToolErrorType, classify_exception
from pipeline._exceptions import ArtifactNotFound, InvalidArtifactId, PipelineError, ToolTimeoutError

RETRYABLE = {"timeout", "rate_limit", "resource_error", "transient_error"}
PERMANENT = {"permission_denied", "invalid_parameters", "not_found", "validation_error"}


def test_it_has_the_seeds_eleven_types():
    assert {t.value for t in ToolErrorType} == RETRYABLE | PERMANENT | {
        "execution_error", "internal_error", "dependency_error"
    }


def test_it_classifies_retryable_and_permanent():
    for kind in ToolErrorType:
        assert kind.is_retryable == (kind.value in RETRYABLE)
        assert kind.is_permanent == (kind.value in PERMANENT)
    assert not ToolErrorType.EXECUTION_ERROR.is_retryable and not ToolErrorType.EXECUTION_ERROR.is_permanent


class Params(BaseModel):
    n: int


def pydantic_error():
    try:
        Params(n="x")
    except ValidationError as exc:
        return exc


@pytest.mark.parametrize(
    "exc, expected",
    [
        (TimeoutError("slow"), ToolErrorType.TIMEOUT),
        (ToolTimeoutError("slow"), ToolErrorType.TIMEOUT),
        (socket.timeout("slow"), ToolErrorType.TIMEOUT),
        (PermissionError("no"), ToolErrorType.PERMISSION_DENIED),
        (ValueError("bad"), ToolErrorType.INVALID_PARAMETERS),
        (TypeError("bad"), ToolErrorType.INVALID_PARAMETERS),
        (InvalidArtifactId("../x"), ToolErrorType.INVALID_PARAMETERS),
        (pydantic_error(), ToolErrorType.INVALID_PARAMETERS),
        (FileNotFoundError("f"), ToolErrorType.NOT_FOUND),
        (KeyError("k"), ToolErrorType.NOT_FOUND),
        (ArtifactNotFound("artifact_x"), ToolErrorType.NOT_FOUND),
        (ConnectionResetError("reset"), ToolErrorType.TRANSIENT_ERROR),
        (ConnectionError("down"), ToolErrorType.TRANSIENT_ERROR),
        (MemoryError(), ToolErrorType.RESOURCE_ERROR),
        (RuntimeError("boom"), ToolErrorType.EXECUTION_ERROR),
        (ZeroDivisionError(), ToolErrorType.EXECUTION_ERROR),
        (ToolError("rate_limit", "slow down"), ToolErrorType.RATE_LIMIT),
    ],
)
def test_it_classifies_exceptions(exc, expected):
    assert classify_exception(exc) is expected


def test_it_lets_tools_say_exactly_what_failed():
    exc = ToolError(ToolErrorType.DEPENDENCY_ERROR, "CRM is down", code="CRM_503")
    assert isinstance(exc, PipelineError)
    response = ToolErrorResponse.from_exception("call_1", exc)
    assert (response.error_type, response.error_code, response.error_message) == (
        ToolErrorType.DEPENDENCY_ERROR, "CRM_503", "CRM is down"
    )


def test_it_defaults_the_code_to_the_type():
    assert ToolError("not_found", "x").code == "NOT_FOUND"


def test_it_refuses_an_unknown_error_type():
    with pytest.raises(ValueError):
        ToolError("oops", "x")


def test_it_says_should_retry_from_the_type():
    assert ToolErrorResponse(tool_call_id="c", error_type="rate_limit", error_code="R", error_message="m").should_retry
    assert not ToolErrorResponse(tool_call_id="c", error_type="not_found", error_code="N", error_message="m").should_retry


def test_it_converts_to_a_result_in_the_standard_error_observation():
    result = ToolErrorResponse(
        tool_call_id="call_1", error_type="not_found", error_code="NOT_FOUND", error_message="no such table"
    ).to_result(retry_count=2, last_error="not_found: no such table")
    assert not result.success and result.retry_count == 2
    assert (result.error_type, result.error_code, result.error_message) == ("not_found", "NOT_FOUND", "no such table")
    assert result.observation == (
        "Operation failed.\n\nError Type: not_found\nError Code: NOT_FOUND\n"
        "Error Message: no such table\n\nTool Call ID: call_1"
    )


def test_it_describes_bare_exceptions_by_class_and_keys_readably():
    assert ToolErrorResponse.from_exception("c", ZeroDivisionError()).error_message == "ZeroDivisionError"
    assert ToolErrorResponse.from_exception("c", KeyError("region")).error_message == "missing key 'region'"


def test_it_bounds_a_hostile_error_message():
    response = ToolErrorResponse.from_exception("c", ValueError("x" * 1_000_000))
    assert len(response.error_message) < 2_100


def test_it_survives_an_exception_whose_str_fails():
    class Nasty(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert ToolErrorResponse.from_exception("c", Nasty()).error_message == "Nasty"


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_call_id": ""},
        {"error_type": "bogus"},
        {"error_code": ""},
        {"extra": True},
    ],
)
def test_it_refuses_malformed_error_responses(fields):
    base = {"tool_call_id": "c", "error_type": "timeout", "error_code": "T", "error_message": "m"}
    with pytest.raises(ValidationError):
        ToolErrorResponse(**{**base, **fields})
