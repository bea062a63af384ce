"""Datasets: cases kept from production for an agent's regression runs.

A dataset is JSON Lines, one ``DatasetItem`` a line: ``input`` (the user message,
the context the model saw, and the tools: ``tools_offered`` to the model when the
dashboard knew them from a span, else ``tools_called``, those the agent called),
``output`` (what it did, as
recorded), ``expected_output`` (what it should have done), ``source`` (where the
case came from) and ``item_id`` (unique in the dataset: importing a file twice adds
nothing). The dashboard exports and imports this form; an agent's test suite reads
it from a file (``read_dataset``) or from the dashboard (``fetch_dataset``) and
replays each item's input.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Annotated, Any, Iterable, Iterator, Optional, Union
from urllib.parse import quote

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ._delivery import Transport, UrllibTransport
from ._exceptions import PipelineError
from ._records import Identifier, JsonObject, _limit_depth

MAX_LINE_BYTES = 4 * 1024 * 1024  # one item; a longer line is refused, not read whole


def _limit_value_depth(value: Any) -> Any:
    _limit_depth({"value": value})
    return value


JsonValue = Annotated[Any, AfterValidator(_limit_value_depth)]


def _item_id() -> str:
    return str(uuid.uuid4())


class DatasetItem(BaseModel):
    """One case of a dataset (a line of its JSONL)."""

    model_config = ConfigDict(extra="forbid")

    item_id: Identifier = Field(default_factory=_item_id)
    input: JsonObject
    output: JsonValue = None
    expected_output: JsonValue = None
    source: JsonObject = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)


class DatasetError(PipelineError):
    """A dataset that cannot be read: the message names the line and what is wrong."""


def parse_dataset_line(line: Union[str, bytes], number: int = 1) -> Optional[DatasetItem]:
    """One JSONL line as an item (None for a blank line); DatasetError says why not."""
    if len(line) > MAX_LINE_BYTES:
        raise DatasetError(f"line {number}: longer than {MAX_LINE_BYTES} bytes")
    text = line.decode("utf-8") if isinstance(line, bytes) else line
    if not text.strip():
        return None
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise DatasetError(f"line {number}: not JSON ({str(exc)[:120]})") from None
    try:
        return DatasetItem.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "item"
        raise DatasetError(f"line {number}: {where}: {first['msg']}"[:300]) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def read_dataset(path: Union[str, Path]) -> Iterator[DatasetItem]:
    """The items of a JSONL file, one at a time (the file is never read whole)."""
    with open(path, "rb") as lines:
        number = 0
        while line := lines.readline(MAX_LINE_BYTES + 1):  # a line past the bound is not read whole
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise DatasetError(f"line {number}: longer than {MAX_LINE_BYTES} bytes")
            item = parse_dataset_line(line, number)
            if item is not None:
                yield item


def write_dataset(path: Union[str, Path], items: Iterable[DatasetItem]) -> int:
    """Write items as JSONL; returns how many."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for item in items:
            out.write(item.model_dump_json() + "\n")
            count += 1
    return count


def _dataset_url(endpoint: str, name: str) -> str:
    return f"{endpoint.rstrip('/')}/api/v1/datasets/{quote(name, safe='')}/items"


def fetch_dataset(endpoint: str, api_key: str, name: str, *, transport: Optional[Transport] = None,
                  timeout_s: float = 30.0) -> Iterator[DatasetItem]:
    """The items of the dashboard's dataset ``name`` (``GET /api/v1/datasets/{name}/items``)."""
    status, _, body = (transport or UrllibTransport()).send(
        "GET", _dataset_url(endpoint, name), {"Authorization": f"Bearer {api_key}"}, b"", timeout_s)
    if status != 200:
        raise DatasetError(f"dataset {name!r}: the dashboard answered {status}: {body[:200]!r}")
    for number, line in enumerate(body.splitlines(), start=1):
        item = parse_dataset_line(line, number)
        if item is not None:
            yield item


def send_dataset(endpoint: str, api_key: str, name: str, items: Iterable[DatasetItem], *,
                 transport: Optional[Transport] = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """Add items to the dashboard's dataset ``name`` (made when new): ``POST
    /api/v1/datasets/{name}/items`` with JSONL; returns its answer ({"added", "duplicates"})."""
    body = "".join(item.model_dump_json() + "\n" for item in items).encode()
    status, _, answer = (transport or UrllibTransport()).send(
        "POST", _dataset_url(endpoint, name),
        {"Authorization": f"Bearer {api_key}", "Content-Type": "application/x-ndjson"}, body, timeout_s)
    if status != 200:
        raise DatasetError(f"dataset {name!r}: the dashboard answered {status}: {answer[:200]!r}")
    return json.loads(answer)
