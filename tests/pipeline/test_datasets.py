"""Datasets as JSON Lines: DatasetItem, reading a file one line at a time with the
bad line named, writing one back."""

from __future__ import annotations

import pytest

from pipeline import DatasetError, DatasetItem, parse_dataset_line, read_dataset, write_dataset


def test_it_writes_and_reads_a_dataset_back(tmp_path):
    items = [DatasetItem(input={"user_message": "sales?", "messages": [], "tools": ["query"]},
                         output={"final_answer": "12"}, expected_output={"figures": [12]},
                         source={"conversation_id": "c1", "round_id": "r1"}),
             DatasetItem(item_id="second", input={"user_message": "区域？"}, expected_output="华东")]
    path = tmp_path / "cases.jsonl"
    assert write_dataset(path, items) == 2
    assert list(read_dataset(path)) == items


def test_it_skips_blank_lines_and_names_the_bad_one(tmp_path):
    path = tmp_path / "cases.jsonl"
    path.write_text('{"input": {}}\n\n{"input": {"a": 1}}\n{"input": []}\n')
    reading = read_dataset(path)
    assert next(reading).input == {} and next(reading).input == {"a": 1}
    with pytest.raises(DatasetError, match="line 4: input"):
        next(reading)


@pytest.mark.parametrize("line, words", [
    ("{", "line 1: not JSON"), ('{"input": {}, "x": 1}', "line 1: x"), ('{"input": {}, "output": NaN}', "not JSON"),
    ('{"input": {}, "item_id": ""}', "item_id"), ('{"input": ' + "[" * 50 + "]" * 50 + "}", "line 1"),
    ('{"input": {}, "expected_output": ' + "[" * 40 + "]" * 40 + "}", "nested deeper"),
])
def test_it_refuses_what_is_not_an_item(line, words):
    with pytest.raises(DatasetError, match=words):
        parse_dataset_line(line)


def test_it_refuses_a_line_too_long_to_read(tmp_path, monkeypatch):
    from pipeline import _datasets

    monkeypatch.setattr(_datasets, "MAX_LINE_BYTES", 100)
    path = tmp_path / "big.jsonl"
    path.write_text('{"input": {"text": "' + "x" * 200 + '"}}\n')
    with pytest.raises(DatasetError, match="longer than 100 bytes"):
        list(read_dataset(path))
