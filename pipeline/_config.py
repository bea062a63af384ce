"""The seeds' unified config interface: ``to_dict`` / ``from_dict`` / ``validate``.

Config classes are dataclasses that mix this in. ``from_dict`` refuses unknown keys
and runs ``validate``; ``validate`` raises ConfigError (a ValueError) naming the field.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any, Mapping, TypeVar

from ._exceptions import ConfigError

C = TypeVar("C", bound="BaseConfig")


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


class BaseConfig:
    """Mixin for dataclass configs."""

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        if not isinstance(data, Mapping):
            raise ConfigError(cls.__name__, "expected a mapping")
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(unknown[0], f"unknown field for {cls.__name__}")
        try:
            config = cls(**dict(data))
        except (TypeError, ValueError) as exc:
            raise ConfigError(cls.__name__, str(exc)) from None
        config.validate()
        return config

    def validate(self) -> bool:  # pragma: no cover - every subclass overrides
        return True


def require(condition: bool, field: str, problem: str) -> None:
    """Raise ConfigError(field, problem) unless condition holds."""
    if not condition:
        raise ConfigError(field, problem)
