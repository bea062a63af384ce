import dataclasses
import datetime as dt
import json
import uuid
from decimal import Decimal
from enum import Enum
from pathlib import PurePosixPath

import pytest
from pydantic import BaseModel

from pipeline import OutputLevel, format_observation, resolve_output_level, summarize_data, to_json
from pipeline._levels import TRUNCATION_MARKER, artifact_observation, canonical_json

ROWS = [{"id": i, "name": f"user{i}"} for i in range(10)]


class Colour(Enum):
    RED = "red"


class Point(BaseModel):
    x: int
    when: dt.date


@dataclasses.dataclass
class Sale:
    amount: Decimal
    at: dt.datetime


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


# --------------------------------------------------------------------------- to_json


def test_it_encodes_the_awkward_types():
    value = {
        "at": dt.datetime(2025, 2, 5, 12, 30),
        "day": dt.date(2025, 2, 5),
        "price": Decimal("12.50"),
        "raw": b"\x00\xffab",
        "tags": {"b", "a"},
        "pair": (1, 2),
        "colour": Colour.RED,
        "point": Point(x=1, when=dt.date(2025, 1, 1)),
        "sale": Sale(Decimal("3.10"), dt.datetime(2025, 1, 1, 9)),
        "id": uuid.UUID(int=1),
        "path": PurePosixPath("/a/b"),
    }
    decoded = json.loads(to_json(value))
    assert decoded["at"] == "2025-02-05T12:30:00"
    assert decoded["day"] == "2025-02-05"
    assert decoded["price"] == "12.50"  # exact: no float rounding
    assert decoded["raw"] == "AP9hYg=="  # base64
    assert decoded["tags"] == ["a", "b"]
    assert decoded["pair"] == [1, 2]
    assert decoded["colour"] == "red"
    assert decoded["point"] == {"x": 1, "when": "2025-01-01"}
    assert decoded["sale"] == {"amount": "3.10", "at": "2025-01-01T09:00:00"}
    assert decoded["id"] == "00000000-0000-0000-0000-000000000001"
    assert decoded["path"] == "/a/b"


def test_it_falls_back_to_repr_for_arbitrary_objects():
    class Thing:
        def __repr__(self) -> str:
            return "<Thing 7>"

    assert json.loads(to_json({"t": Thing()})) == {"t": "<Thing 7>"}


def test_it_survives_a_broken_repr():
    assert json.loads(to_json([BrokenRepr()])) == ["<BrokenRepr object>"]


def test_it_handles_non_string_dict_keys():
    decoded = json.loads(to_json({1: "a", None: "b", (1, 2): "c", Colour.RED: "d", 2.5: "e"}))
    assert decoded == {"1": "a", "null": "b", "[1, 2]": "c", '"red"': "d", "2.5": "e"}


def test_it_sorts_mixed_keys_without_crashing():
    assert json.loads(to_json({1: "a", "b": 2}, sort_keys=True)) == {"1": "a", "b": 2}


def test_it_marks_circular_references():
    data: dict = {"name": "loop"}
    data["self"] = data
    items: list = [1]
    items.append(items)
    assert json.loads(to_json(data)) == {"name": "loop", "self": "<circular reference>"}
    assert json.loads(to_json(items)) == [1, "<circular reference>"]


def test_it_cuts_hostile_nesting_instead_of_crashing():
    deep: list = []
    cursor = deep
    for _ in range(50_000):
        cursor.append([])
        cursor = cursor[0]
    text = to_json(deep)
    assert "<nested too deep>" in text
    json.loads(text)


def test_it_keeps_non_ascii_readable():
    assert to_json({"城市": "扬州"}) == '{"城市": "扬州"}'


def test_it_indents_when_asked():
    assert to_json({"a": 1}, indent=2) == '{\n  "a": 1\n}'


def test_it_makes_canonical_json_independent_of_order():
    a = {"b": {"y": 1, "x": 2}, "a": [{"d": 1, "c": 2}], "s": {3, 1, 2}}
    b = {"s": {2, 3, 1}, "a": [{"c": 2, "d": 1}], "b": {"x": 2, "y": 1}}
    assert canonical_json(a) == canonical_json(b)
    assert canonical_json(a) == '{"a":[{"c":2,"d":1}],"b":{"x":2,"y":1},"s":[1,2,3]}'


def test_it_orders_mixed_type_sets_stably():
    assert canonical_json({1, "a", None}) == canonical_json({None, "a", 1})


# --------------------------------------------------------------------------- BRIEF


def test_it_says_how_many_items_at_brief():
    assert format_observation(ROWS, OutputLevel.BRIEF) == "Found 10 items"
    assert format_observation([1], "brief") == "Found 1 item"
    assert format_observation([], "brief") == "Found 0 items"


def test_it_reports_success_and_failure_dicts_at_brief():
    assert format_observation({"success": True, "message": "saved"}, "brief") == "Success: saved"
    assert format_observation({"success": False}, "brief") == "Failed: Operation completed"


def test_it_counts_fields_of_other_dicts_at_brief():
    assert format_observation({"a": 1, "b": 2}, "brief") == "Result has 2 fields"


def test_it_cuts_text_at_brief_with_a_marker():
    text = format_observation("x" * 150, "brief")
    assert text == "x" * 100 + TRUNCATION_MARKER
    assert format_observation("short", "brief") == "short"


def test_it_cuts_a_long_success_message_at_brief():
    text = format_observation({"success": True, "message": "m" * 500}, "brief")
    assert text.endswith(TRUNCATION_MARKER) and len(text) == 100 + len(TRUNCATION_MARKER)


# --------------------------------------------------------------------------- STANDARD


def test_it_previews_three_items_at_standard():
    text = format_observation(ROWS, OutputLevel.STANDARD)
    assert text.splitlines() == [
        "Found 10 items:",
        '  - {"id": 0, "name": "user0"}',
        '  - {"id": 1, "name": "user1"}',
        '  - {"id": 2, "name": "user2"}',
        "  ... and 7 more",
    ]


def test_it_has_no_more_line_for_short_lists():
    assert format_observation(["a", "b"], "standard") == "Found 2 items:\n  - a\n  - b"
    assert format_observation([], "standard") == "Found 0 items"


def test_it_cuts_a_huge_preview_item():
    text = format_observation([{"blob": "z" * 10_000}], "standard")
    assert len(text) < 400 and TRUNCATION_MARKER in text


def test_it_pretty_prints_dicts_at_standard():
    assert format_observation({"a": 1}, "standard") == '{\n  "a": 1\n}'


def test_it_cuts_big_dicts_at_standard_with_a_marker():
    text = format_observation({f"k{i}": "v" * 50 for i in range(100)}, "standard")
    body, marker = text.rsplit("\n", 1)
    assert len(body) == 500 and marker == TRUNCATION_MARKER


def test_it_reads_models_and_dataclasses_as_dicts():
    assert format_observation(Point(x=1, when=dt.date(2025, 1, 1)), "brief") == "Result has 2 fields"
    assert format_observation(Sale(Decimal(1), dt.datetime(2025, 1, 1)), "brief") == "Result has 2 fields"
    assert format_observation((1, 2, 3), "brief") == "Found 3 items"


# --------------------------------------------------------------------------- FULL


def test_it_gives_complete_json_at_full():
    assert json.loads(format_observation(ROWS, OutputLevel.FULL)) == ROWS


def test_it_gives_text_as_is_at_full():
    assert format_observation("line 1\nline 2", "full") == "line 1\nline 2"


def test_it_gives_the_artifact_reference_at_full_never_a_path():
    text = format_observation(ROWS, "full", artifact_id="artifact_" + "a" * 16)
    assert text.startswith("Data stored as artifact: artifact_aaaaaaaaaaaaaaaa\n")
    assert "Data summary: List with 10 items. First item keys: ['id', 'name']" in text
    assert "/" not in text


def test_it_uses_a_given_summary_in_the_artifact_observation():
    text = artifact_observation("artifact_" + "b" * 16, "ten rows")
    assert text.endswith("Data summary: ten rows")


def test_it_refuses_an_unknown_level():
    with pytest.raises(ValueError):
        format_observation([], "verbose")


# --------------------------------------------------------------------------- summary


def test_it_summarises_lists_safely():
    assert summarize_data([]) == "List with 0 items. First item keys: N/A"
    assert summarize_data([1, 2]) == "List with 2 items. First item keys: N/A"
    assert summarize_data([{"a": 1}]) == "List with 1 item. First item keys: ['a']"


def test_it_summarises_dicts_text_and_scalars():
    assert summarize_data({"a": 1, 2: "b"}) == "Dictionary with 2 keys. Top keys: a, 2"
    assert summarize_data("t" * 500) == "t" * 200 + TRUNCATION_MARKER
    assert summarize_data(None) == "null"
    assert summarize_data(42) == "42"


# --------------------------------------------------------------------------- level choice


def test_it_prefers_the_explicit_level():
    assert resolve_output_level("full", OutputLevel.BRIEF, 0.99) is OutputLevel.FULL


def test_it_prefers_the_tool_default_over_dynamic_and_global():
    assert resolve_output_level(None, "full", 0.99) is OutputLevel.FULL


def test_it_forces_brief_when_context_is_nearly_full():
    assert resolve_output_level(None, None, 0.81) is OutputLevel.BRIEF
    assert resolve_output_level(None, None, 0.8) is OutputLevel.STANDARD
    assert resolve_output_level(None, None, 0.5, brief_threshold=0.4) is OutputLevel.BRIEF


def test_it_falls_back_to_the_global_default():
    assert resolve_output_level(None, None, 0.1, OutputLevel.FULL) is OutputLevel.FULL


def test_it_treats_junk_usage_as_no_pressure():
    assert resolve_output_level(None, None, float("nan")) is OutputLevel.STANDARD
    assert resolve_output_level(None, None, "lots") is OutputLevel.STANDARD  # type: ignore[arg-type]
