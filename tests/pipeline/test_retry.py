import pytest
from pydantic import ValidationError

from pipeline import ToolErrorType, ToolRetryPolicy
from pipeline._exceptions import ConfigError


def test_it_retries_listed_types_until_max_retries():
    policy = ToolRetryPolicy(max_retries=2)
    assert policy.should_retry(ToolErrorType.TIMEOUT, 0)
    assert policy.should_retry("rate_limit", 1)
    assert not policy.should_retry(ToolErrorType.TIMEOUT, 2)


def test_it_never_retries_unlisted_or_unknown_types():
    policy = ToolRetryPolicy(retry_on=[ToolErrorType.TIMEOUT])
    assert not policy.should_retry(ToolErrorType.RATE_LIMIT, 0)
    assert not policy.should_retry(ToolErrorType.NOT_FOUND, 0)
    assert not policy.should_retry("bogus", 0)


def test_it_retries_every_transient_type_by_default():
    assert set(ToolRetryPolicy().retry_on) == {t for t in ToolErrorType if t.is_retryable}


def test_it_backs_off_exponentially_up_to_the_cap():
    policy = ToolRetryPolicy(initial_delay_ms=100, backoff_multiplier=2, max_delay_ms=500)
    assert [policy.get_delay(a) for a in range(5)] == [100, 200, 400, 500, 500]


def test_it_caps_huge_attempts_without_overflow():
    policy = ToolRetryPolicy()
    assert policy.get_delay(10**6) == policy.max_delay_ms
    assert policy.get_retry_timeout(1000, 10**6) == policy.max_timeout_ms
    assert policy.get_delay(-3) == policy.initial_delay_ms


def test_it_grows_the_timeout_up_to_the_cap():
    policy = ToolRetryPolicy(timeout_multiplier=2, max_timeout_ms=5000)
    assert [policy.get_retry_timeout(1000, a) for a in range(5)] == [1000, 2000, 4000, 5000, 5000]


def test_it_round_trips_through_a_dict():
    policy = ToolRetryPolicy(max_retries=5, retry_on=["timeout"], initial_delay_ms=10)
    data = policy.to_dict()
    assert data["retry_on"] == ["timeout"]
    assert ToolRetryPolicy.from_dict(data) == policy


@pytest.mark.parametrize(
    "data, field",
    [
        ({"initial_delay_ms": -1}, "initial_delay_ms"),
        ({"max_delay_ms": -5, "initial_delay_ms": 0}, "max_delay_ms"),
        ({"initial_delay_ms": 500, "max_delay_ms": 100}, "max_delay_ms"),
        ({"backoff_multiplier": 0.5}, "backoff_multiplier"),
        ({"backoff_multiplier": float("inf")}, "backoff_multiplier"),
        ({"timeout_multiplier": 0.9}, "timeout_multiplier"),
        ({"max_timeout_ms": 0}, "max_timeout_ms"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 10**9}, "max_retries"),
        ({"retry_on": ["not_found"]}, "retry_on"),
        ({"retry_on": ["bogus"]}, "retry_on"),
        ({"jitter": True}, "jitter"),
        ({"max_retries": "many"}, "max_retries"),
    ],
)
def test_it_refuses_bad_values_naming_the_field(data, field):
    with pytest.raises(ValueError, match=field):
        ToolRetryPolicy.from_dict(data)


def test_it_refuses_a_non_mapping():
    with pytest.raises(ValidationError):
        ToolRetryPolicy.from_dict(["max_retries", 3])  # type: ignore[arg-type]


def test_it_is_immutable_and_validates_on_demand():
    policy = ToolRetryPolicy()
    assert policy.validate() is True
    with pytest.raises(ValidationError):
        policy.initial_delay_ms = -1
    object.__setattr__(policy, "max_timeout_ms", -1)  # force a bad value past pydantic
    with pytest.raises(ConfigError, match="max_timeout_ms"):
        policy.validate()
