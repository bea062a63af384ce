"""Output levels: how verbose an observation is (an engineering choice, orthogonal
to what the observation says), and the formatters that render raw tool data at a
level.

One JSON encoder (``to_json``) serves every part of the tool protocol: observations,
payload hashes, idempotency keys. It never raises, because a tool's odd return value
(a datetime, a Decimal, a set, an object with a broken ``__repr__``) must become an
observation, not a crash in the agent loop.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import json
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
import math
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any, Optional, Union

from pydantic import BaseModel


class OutputLevel(str, Enum):
    """Verbosity of a tool observation: BRIEF (key facts), STANDARD (actionable
    preview), FULL (complete data, or an artifact reference when large)."""

    BRIEF = "brief"
    STANDARD = "standard"
    FULL = "full"


BRIEF_LIMIT = 100  # characters of a BRIEF string observation
STANDARD_LIMIT = 500  # characters of a STANDARD string or dict observation
PREVIEW_ITEMS = 3  # list items shown at STANDARD
PREVIEW_ITEM_LIMIT = 300  # characters per previewed list item
SUMMARY_LIMIT = 200  # characters of a data summary
TRUNCATION_MARKER = "... [truncated]"
BRIEF_THRESHOLD = 0.8  # context usage above which the dynamic rule forces BRIEF

_MAX_DEPTH = 100  # nesting beyond this is cut when sanitising (the C encoder would recurse)
_REPR_LIMIT = 200


# --------------------------------------------------------------------------- JSON


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not break the observation
        return f"<{type(value).__name__} object>"
    return text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + TRUNCATION_MARKER


def _sorted_items(values: Any) -> list[Any]:
    """A set as a list in a stable order, so equal sets encode (and hash) equally."""
    items = list(values)
    try:
        return sorted(items)
    except TypeError:  # mixed types: order by their canonical JSON instead
        return sorted(items, key=lambda v: to_json(v, sort_keys=True))


def _jsonable(value: Any) -> Any:
    """The ``default`` hook: turn one non-JSON value into something JSON can take.

    Decisions: Decimals become strings (exact, no float rounding of money);
    bytes become base64 text (complete and reversible); sets become sorted lists.
    """
    try:
        if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
            return value.isoformat()
        if isinstance(value, _dt.timedelta):
            return value.total_seconds()
        if isinstance(value, Decimal):
            return str(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return base64.b64encode(bytes(value)).decode("ascii")
        if isinstance(value, (set, frozenset)):
            return _sorted_items(value)
        if isinstance(value, Enum):
            return value.value
        if isinstance(value, BaseModel):
            return value.model_dump()
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, (uuid.UUID, PurePath)):
            return str(value)
        if isinstance(value, Mapping):
            return dict(value)
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            return list(value)
    except Exception:
        pass
    return _safe_repr(value)


_NATIVE = (str, int, float, bool, type(None))


def _key(key: Any) -> str:
    """A dict key as JSON would write it; keys JSON refuses get their JSON text."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, (int, float)):
        return json.dumps(key) if math.isfinite(key) else str(key)
    return to_json(key, sort_keys=True)


def _sanitise(value: Any, depth: int, active: set[int]) -> Any:
    """Plain JSON data from anything: string keys, no cycles, bounded depth.

    Only used when the fast path (the C encoder with the ``default`` hook) fails,
    e.g. on tuple keys, mixed keys with sort_keys, cycles or very deep nesting.
    """
    if isinstance(value, _NATIVE):
        return value
    if depth > _MAX_DEPTH:
        return "<nested too deep>"
    if isinstance(value, (dict, list, tuple)):
        marker = id(value)
        if marker in active:
            return "<circular reference>"
        active.add(marker)
        try:
            if isinstance(value, dict):
                return {_key(k): _sanitise(v, depth + 1, active) for k, v in value.items()}
            return [_sanitise(v, depth + 1, active) for v in value]
        finally:
            active.discard(marker)
    converted = _jsonable(value)
    if isinstance(converted, str):
        return converted
    return _sanitise(converted, depth + 1, active)


def _c_encoder(sort_keys: bool, compact: bool) -> Any:
    """A reusable C encoder: ``json.dumps`` builds one (and an encoder object) per
    call, which is most of the cost of encoding a small value. Built without the
    cycle check: a cycle ends in RecursionError, which ``_dumps`` turns into the
    marker as it does for very deep data."""
    if c_make_encoder is None:  # pragma: no cover - CPython always has it
        return None
    return c_make_encoder(
        None, _jsonable, encode_basestring, None,
        ":" if compact else ": ", "," if compact else ", ", sort_keys, False, True,
    )


_ENCODERS = {(False, False): _c_encoder(False, False), (True, True): _c_encoder(True, True)}


def _dumps(value: Any, indent: Optional[int], sort_keys: bool, compact: bool) -> str:
    separators = (",", ":") if compact else None
    try:
        encoder = _ENCODERS.get((sort_keys, compact)) if indent is None else None
        if encoder is not None:
            return "".join(encoder(value, 0))
        return json.dumps(
            value,
            ensure_ascii=False,
            indent=indent,
            sort_keys=sort_keys,
            separators=separators,
            default=_jsonable,
        )
    except (TypeError, ValueError, RecursionError):
        plain = _sanitise(value, 0, set())
        return json.dumps(
            plain, ensure_ascii=False, indent=indent, sort_keys=sort_keys, separators=separators
        )


def to_json(value: Any, indent: Optional[int] = None, *, sort_keys: bool = False) -> str:
    """Encode anything as JSON text, never raising.

    Handles datetimes/dates (ISO 8601), Decimals (strings), bytes (base64), sets
    (sorted lists), tuples, pydantic models, dataclasses, enums, UUIDs, paths,
    non-string dict keys (written as JSON would, or as their JSON text), cycles and
    very deep nesting (replaced by a marker); anything else becomes its repr.
    Non-ASCII text stays readable (no ``\\u`` escapes).
    """
    return _dumps(value, indent, sort_keys, compact=False)


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys at every level: equal data, equal text."""
    return _dumps(value, None, sort_keys=True, compact=True)


def _json_prefix(value: Any, limit: int, indent: Optional[int] = None) -> tuple[str, bool]:
    """The first ``limit`` characters of ``to_json(value, indent)`` and whether it
    was cut, encoding lazily so a preview of huge data costs little."""
    encoder = json.JSONEncoder(ensure_ascii=False, indent=indent, default=_jsonable)
    parts: list[str] = []
    size = 0
    try:
        for chunk in encoder.iterencode(value):
            parts.append(chunk)
            size += len(chunk)
            if size > limit:
                return "".join(parts)[:limit], True
    except (TypeError, ValueError, RecursionError):
        text = to_json(value, indent)
        return (text[:limit], True) if len(text) > limit else (text, False)
    return "".join(parts), False


# --------------------------------------------------------------------------- formatters


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + TRUNCATION_MARKER


def _normalise(data: Any) -> Any:
    """Top-level shape for formatting: models and dataclasses read as dicts,
    tuples and sets as lists (only the outer value; nested ones stay for the encoder)."""
    if isinstance(data, BaseModel) or (
        dataclasses.is_dataclass(data) and not isinstance(data, type)
    ):
        converted = _jsonable(data)
        return converted if isinstance(converted, dict) else data
    if isinstance(data, (set, frozenset)):
        return _sorted_items(data)
    if isinstance(data, tuple):
        return list(data)
    if isinstance(data, Mapping) and not isinstance(data, dict):
        return dict(data)
    return data


def _scalar_text(data: Any) -> str:
    return data if isinstance(data, str) else to_json(data)


def _items(count: int) -> str:
    return f"{count} item" if count == 1 else f"{count} items"


def _format_brief(data: Any) -> str:
    if isinstance(data, list):
        return f"Found {_items(len(data))}"
    if isinstance(data, dict):
        if "success" in data:
            status = "Success" if data["success"] else "Failed"
            message = data.get("message", "Operation completed")
            return _cut(f"{status}: {_scalar_text(message)}", BRIEF_LIMIT)
        return f"Result has {len(data)} field" + ("" if len(data) == 1 else "s")
    return _cut(_scalar_text(data), BRIEF_LIMIT)


#: Data whose whole JSON is at most this long is small enough to encode each preview
#: item completely with the C encoder; bigger data is encoded lazily, up to the cut.
_EAGER_PREVIEW_CHARS = 64 * 1024


def _format_standard(data: Any, small: bool = False) -> str:
    if isinstance(data, list):
        if not data:
            return "Found 0 items"
        lines = []
        for item in data[:PREVIEW_ITEMS]:
            text = item if isinstance(item, str) else None
            if text is None:
                if small:
                    text = to_json(item)
                    cut = len(text) > PREVIEW_ITEM_LIMIT
                    text = text[:PREVIEW_ITEM_LIMIT] if cut else text
                else:
                    text, cut = _json_prefix(item, PREVIEW_ITEM_LIMIT)
                text = text + TRUNCATION_MARKER if cut else text
            else:
                text = _cut(text, PREVIEW_ITEM_LIMIT)
            lines.append(f"  - {text}")
        more = f"\n  ... and {len(data) - PREVIEW_ITEMS} more" if len(data) > PREVIEW_ITEMS else ""
        return f"Found {_items(len(data))}:\n" + "\n".join(lines) + more
    if isinstance(data, dict):
        text, cut = _json_prefix(data, STANDARD_LIMIT, indent=2)
        return text + "\n" + TRUNCATION_MARKER if cut else text
    return _cut(_scalar_text(data), STANDARD_LIMIT)


def artifact_observation(artifact_id: str, data_summary: Optional[str]) -> str:
    """What the model sees for data kept in the artifact store: the id, never a path."""
    return (
        f"Data stored as artifact: {artifact_id}\n\n"
        "Large dataset available for subsequent tool access.\n\n"
        "To access this data, reference the artifact_id in your next tool call.\n"
        "The system will securely retrieve the data for you.\n\n"
        f"Data summary: {data_summary or 'N/A'}"
    )


def _render(
    data: Any,
    level: OutputLevel,
    artifact_id: Optional[str],
    data_summary: Optional[str],
    full_json: Optional[str],
) -> str:
    """format_observation with the FULL text already encoded (the executor encodes once)."""
    if level is OutputLevel.FULL and artifact_id:
        return artifact_observation(artifact_id, data_summary or summarize_data(data))
    data = _normalise(data)
    if level is OutputLevel.BRIEF:
        return _format_brief(data)
    if level is OutputLevel.STANDARD:
        return _format_standard(data, full_json is not None and len(full_json) <= _EAGER_PREVIEW_CHARS)
    if isinstance(data, str):
        return data
    return full_json if full_json is not None else to_json(data)


def format_observation(
    data: Any,
    level: Union[OutputLevel, str],
    *,
    artifact_id: Optional[str] = None,
    data_summary: Optional[str] = None,
) -> str:
    """Render raw tool data as the observation the model reads at ``level``.

    BRIEF: "Found 10 items", "Success: <message>", "Result has N fields", or the
    text cut to 100 characters. STANDARD: the first 3 items and "... and N more", a
    dict as pretty JSON cut at 500 characters, text cut at 500. FULL: the complete
    data (text as is, everything else as JSON), or with ``artifact_id`` the
    artifact reference plus a summary.
    """
    return _render(data, OutputLevel(level), artifact_id, data_summary, None)


def summarize_data(data: Any) -> str:
    """A one-line description of data's shape (the seeds' ``_generate_summary``)."""
    data = _normalise(data)
    if isinstance(data, list):
        first = data[0] if data else None
        keys = [_key(k) for k in list(first)[:20]] if isinstance(first, dict) else "N/A"
        return _cut(f"List with {_items(len(data))}. First item keys: {keys}", 2 * SUMMARY_LIMIT)
    if isinstance(data, dict):
        keys = ", ".join(_key(k) for k in list(data)[:10])
        return _cut(f"Dictionary with {len(data)} keys. Top keys: {keys}", 2 * SUMMARY_LIMIT)
    if isinstance(data, str):
        return _cut(data, SUMMARY_LIMIT)
    text, cut = _json_prefix(data, SUMMARY_LIMIT)
    return text + TRUNCATION_MARKER if cut else text


def resolve_output_level(
    explicit: Union[OutputLevel, str, None],
    tool_default: Union[OutputLevel, str, None],
    context_usage: float,
    global_default: Union[OutputLevel, str] = OutputLevel.STANDARD,
    brief_threshold: float = BRIEF_THRESHOLD,
) -> OutputLevel:
    """The level a call is rendered at: explicit request > tool config > dynamic
    (context usage above ``brief_threshold`` forces BRIEF) > global default.

    A non-finite or non-numeric usage counts as 0 (no pressure) rather than failing
    the tool call.
    """
    if explicit is not None:
        return OutputLevel(explicit)
    if tool_default is not None:
        return OutputLevel(tool_default)
    try:
        usage = float(context_usage)
    except (TypeError, ValueError):
        usage = 0.0
    if math.isfinite(usage) and usage > brief_threshold:
        return OutputLevel.BRIEF
    return OutputLevel(global_default)
