"""What a score may be: the rules of a score config, on plain values (no database).

``score_refusal`` says why a score does not fit its name's config (None when it
does); ``config_problems`` why a config itself makes no sense; ``is_negative``
whether a score counts as negative feedback. The API, the OpenTelemetry path, the
pages' forms and the admin all ask these, so one rule gives one answer everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from django.db import models

LABEL_LENGTH = 200
MAX_LABELS = 100


class ScoreKind(models.TextChoices):
    NUMERIC = "numeric", "numeric"
    CATEGORICAL = "categorical", "categorical"
    BOOLEAN = "boolean", "boolean"


@dataclass(frozen=True, slots=True)
class ConfigRules:
    """The parts of a ScoreConfig the checks read."""

    name: str
    kind: str
    min_value: float | None = None
    max_value: float | None = None
    labels: Sequence[str] = ()
    negative_labels: Sequence[str] = ()


def config_problems(*, kind: str, min_value: float | None, max_value: float | None, labels: Any,
                    negative_labels: Any) -> dict[str, str]:
    """Field -> what is wrong with a config's values (empty when nothing)."""
    problems: dict[str, str] = {}
    if kind not in ScoreKind.values:
        problems["kind"] = f"kind must be one of {', '.join(ScoreKind.values)}"
    for field, value in (("labels", labels), ("negative_labels", negative_labels)):
        if not isinstance(value, list) or not all(isinstance(item, str) and 0 < len(item) <= LABEL_LENGTH
                                                   for item in value):
            problems[field] = f"a list of labels, each 1 to {LABEL_LENGTH} characters"
        elif len(value) > MAX_LABELS or len(set(value)) != len(value):
            problems[field] = f"at most {MAX_LABELS} labels, each once"
    if problems:
        return problems
    if kind == ScoreKind.NUMERIC:
        if min_value is not None and max_value is not None and min_value > max_value:
            problems["max_value"] = "the highest value is below the lowest"
    elif min_value is not None or max_value is not None:
        problems["min_value"] = "only a numeric score has a range"
    if kind == ScoreKind.CATEGORICAL:
        if not labels:
            problems["labels"] = "a categorical score needs its labels"
        elif set(negative_labels) - set(labels):
            problems["negative_labels"] = "negative labels must be among the labels"
    elif labels or negative_labels:
        problems["labels"] = "only a categorical score has labels"
    return problems


def kind_of(value: bool | float | None, label: str | None) -> str:
    """The kind a score's value says it is, when its name has no config."""
    if isinstance(value, bool):
        return ScoreKind.BOOLEAN
    if value is not None:
        return ScoreKind.NUMERIC
    return ScoreKind.CATEGORICAL


def score_refusal(config: ConfigRules | None, value: bool | float | None, label: str | None) -> str | None:
    """Why the score does not fit its name's config, in words for the sender; None
    when it fits (or the name has no config)."""
    if config is None:
        return None
    name, kind = config.name, config.kind
    if kind == ScoreKind.BOOLEAN:
        if not isinstance(value, bool) and value not in (0, 1):
            return f"{name} is a boolean score: send true or false"
        return None
    if kind == ScoreKind.NUMERIC:
        if value is None or isinstance(value, bool):
            return f"{name} is a numeric score: send a number as value"
        low, high = config.min_value, config.max_value
        if (low is not None and value < low) or (high is not None and value > high):
            return f"{name} must be within {_range(low, high)}; got {value:g}"
        return None
    if label is None:
        return f"{name} is a categorical score: send one of its labels ({_labels(config.labels)})"
    if label not in config.labels:
        return f"{name} has no label {label[:60]!r}; its labels are {_labels(config.labels)}"
    return None


def is_negative(config: ConfigRules | None, kind: str, value: float | None, label: str) -> bool:
    """Negative feedback: a boolean false, a label the config calls negative, or a
    number in the lower half of the config's range (strictly below its middle)."""
    if kind == ScoreKind.BOOLEAN:
        return value == 0
    if config is None:
        return False
    if kind == ScoreKind.CATEGORICAL:
        return label in config.negative_labels
    if value is not None and config.min_value is not None and config.max_value is not None:
        return value < (config.min_value + config.max_value) / 2
    return False


def _range(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{low:g}..{high:g}"
    return f">= {low:g}" if low is not None else f"<= {high:g}"


def _labels(labels: Sequence[str]) -> str:
    shown = ", ".join(repr(label) for label in labels[:10])
    return shown + (", …" if len(labels) > 10 else "")
