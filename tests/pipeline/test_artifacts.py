"""ArtifactStore in a temp sandbox: ids, symlinks, restarts, cleanup on a fake clock."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import logging
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline import ARTIFACT_ID_RE, THRESHOLD_BYTES, ArtifactStore, ToolExecutionResult, validate_artifact_id
from pipeline._exceptions import ArtifactError, ArtifactNotFound, ConfigError, InvalidArtifactId

GOOD_ID = "artifact_" + "ab" * 8


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    return tmp_path / "artifacts"


@pytest.fixture()
def store(root: Path, clock: FakeClock) -> ArtifactStore:
    return ArtifactStore(root, clock=clock)


def no_path_in(text: str, root: Path) -> bool:
    return str(root) not in text and str(root.parent) not in text


# --- ids -----------------------------------------------------------------------


def test_it_accepts_well_formed_ids():
    assert validate_artifact_id(GOOD_ID) == GOOD_ID
    assert validate_artifact_id("artifact_" + "0" * 64) == "artifact_" + "0" * 64
    assert ARTIFACT_ID_RE == ToolExecutionResult.model_fields["artifact_id"].metadata[0].pattern


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("../x", "path separators"),
        ("artifact_../../etc", "path separators"),
        ("artifact_0123456789abcdef/../../etc/passwd", "path separators"),
        ("/etc/passwd", "absolute"),
        ("\\\\server\\share", "absolute"),
        ("C:\\Windows", "absolute"),
        ("artifact_0123456789abcdef\x00", "NUL"),
        ("artifact_" + "١٢٣٤٥٦٧٨٩٠١٢٣٤٥٦", "lowercase hex"),  # Arabic-Indic digits
        ("artifact_" + "０" * 16, "lowercase hex"),  # fullwidth digits
        ("artifact_0123456789ABCDEF", "lowercase hex"),
        ("artifact_0123456789abcde", "lowercase hex"),  # 15 digits
        ("artifact_0123456789abcdef\n", "lowercase hex"),
        ("artifact_" + "a" * 65, "too long"),
        ("x" * 1_000_000, "too long"),
        ("", "lowercase hex"),
        ("artifact_", "lowercase hex"),
        ("ARTIFACT_0123456789abcdef", "lowercase hex"),
    ],
)
def test_it_refuses_malformed_and_hostile_ids(value, problem):
    with pytest.raises(InvalidArtifactId, match=problem) as info:
        validate_artifact_id(value)
    assert len(str(info.value)) < 200  # never echoes a huge input


@pytest.mark.parametrize("value", [None, 123, b"artifact_0123456789abcdef", ["artifact_0123456789abcdef"], 1.5])
def test_it_refuses_ids_that_are_not_strings(value):
    with pytest.raises(InvalidArtifactId, match="must be a string"):
        validate_artifact_id(value)


def test_it_validates_ids_on_every_entry_point(store):
    for call in (store.retrieve, store.retrieve_json, store.info, store.delete, store.exists):
        with pytest.raises(InvalidArtifactId):
            call("../../etc/passwd")


# --- store and retrieve ---------------------------------------------------------


def test_it_stores_bytes_as_is(store):
    data = bytes(range(256)) * 10
    info = store.store(data, tool_call_id="call_1")
    assert info.artifact_id == "artifact_" + hashlib.sha256(data).hexdigest()
    assert re.fullmatch(ARTIFACT_ID_RE, info.artifact_id)
    assert (info.size_bytes, info.sha256, info.content_type) == (2560, hashlib.sha256(data).hexdigest(), "application/octet-stream")
    assert info.tool_call_id == "call_1"
    assert info.filename == f"{info.artifact_id}.bin"
    assert store.retrieve(info.artifact_id) == data


def test_it_stores_text_as_utf8(store):
    info = store.store("扬州 sales: 12.5%")
    assert info.content_type == "text/plain; charset=utf-8"
    assert store.retrieve(info.artifact_id).decode("utf-8") == "扬州 sales: 12.5%"
    assert info.filename.endswith(".txt")


def test_it_stores_anything_else_as_json(store):
    rows = [{"id": 1, "name": "Alice"}, {"id": 2, "name": "鲍勃"}]
    info = store.store(rows)
    assert info.content_type == "application/json"
    assert store.retrieve_json(info.artifact_id) == rows
    assert store.retrieve(info.artifact_id).decode("utf-8") == json.dumps(rows, ensure_ascii=False)


def test_it_stores_values_json_cannot_encode(store):
    class Opaque:
        def __str__(self) -> str:
            return "opaque-thing"

    cyclic: list = [1]
    cyclic.append(cyclic)
    value = {
        "when": dt.datetime(2025, 2, 5, 12, 30, tzinfo=dt.timezone.utc),
        "day": dt.date(2025, 2, 5),
        "price": decimal.Decimal("19.990"),
        "raw": b"\x00\xff",
        "tags": {"b", "a"},
        "id": uuid.UUID(int=1),
        "nan": float("nan"),
        "inf": float("-inf"),
        (1, 2): "tuple key",
        "obj": Opaque(),
        "cycle": cyclic,
    }
    decoded = store.retrieve_json(store.store(value).artifact_id)
    assert decoded["when"] == "2025-02-05T12:30:00+00:00"
    assert decoded["day"] == "2025-02-05"
    assert decoded["price"] == "19.990"
    assert decoded["raw"] == "AP8="
    assert decoded["tags"] == ["a", "b"]
    assert decoded["id"] == str(uuid.UUID(int=1))
    assert (decoded["nan"], decoded["inf"]) == ("nan", "-inf")
    assert decoded["(1, 2)"] == "tuple key"
    assert decoded["obj"] == "opaque-thing"
    assert decoded["cycle"] == [1, "<cycle>"]


def test_it_stores_absurdly_nested_values(store):
    value: list = []
    for _ in range(5000):
        value = [value]
    info = store.store(value)
    assert b"<too deep>" in store.retrieve(info.artifact_id)


def test_it_shares_one_file_for_identical_content(store, root, clock):
    first = store.store(b"same bytes", tool_call_id="call_1")
    clock.advance(60)
    second = store.store(b"same bytes", content_type="text/csv", tool_call_id="call_2")
    assert first.artifact_id == second.artifact_id
    assert second.created_at == first.created_at
    assert second.expires_at > first.expires_at
    assert (second.tool_call_id, second.content_type) == ("call_2", "text/csv")
    assert len(store) == 1 and store.total_bytes == len(b"same bytes")
    assert sorted(p.name for p in root.iterdir()) == sorted([f"{first.artifact_id}.bin", f"{first.artifact_id}.json"])


def test_it_writes_atomically_leaving_no_temp_files(store, root):
    for i in range(20):
        store.store(f"payload {i}" * 1000)
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


def test_it_refuses_bad_content_types_and_tool_call_ids(store):
    with pytest.raises(ArtifactError, match="content_type"):
        store.store(b"x", content_type="text/plain\r\nX-Injected: 1")
    with pytest.raises(ArtifactError, match="content_type"):
        store.store(b"x", content_type="t" * 500)
    with pytest.raises(ConfigError, match="tool_call_id"):
        store.store(b"x", tool_call_id="")


def test_it_keeps_only_a_safe_filename_hint(store):
    info = store.store(b"x", filename="../../etc/pass wd;rm -rf.csv")
    assert info.filename == "pass_wd_rm_-rf.csv"
    assert store.store(b"y", filename="../..").filename.startswith("artifact_")


def test_it_refuses_an_artifact_larger_than_the_store(root, clock):
    small = ArtifactStore(root, max_total_bytes=100, clock=clock)
    with pytest.raises(ArtifactError, match="exceeds"):
        small.store(b"x" * 101)


def test_it_reports_unknown_ids_as_not_found(store):
    with pytest.raises(ArtifactNotFound):
        store.retrieve(GOOD_ID)
    with pytest.raises(KeyError):  # ArtifactNotFound is a KeyError too
        store.info(GOOD_ID)
    assert store.exists(GOOD_ID) is False
    assert store.delete(GOOD_ID) is False


def test_it_says_when_an_artifact_is_not_json(store):
    info = store.store(b"\x00not json")
    with pytest.raises(ArtifactError, match="not JSON"):
        store.retrieve_json(info.artifact_id)


def test_it_deletes_artifacts(store, root):
    info = store.store(b"bye")
    assert store.delete(info.artifact_id) is True
    assert not any(root.iterdir())
    assert store.total_bytes == 0
    with pytest.raises(ArtifactNotFound):
        store.retrieve(info.artifact_id)


def test_it_refuses_a_tampered_file(store, root):
    info = store.store(b"original bytes")
    (root / f"{info.artifact_id}.bin").write_bytes(b"tampered bytes")
    with pytest.raises(ArtifactError, match="corrupt") as exc:
        store.retrieve(info.artifact_id)
    assert no_path_in(str(exc.value), root)


def test_it_notices_a_file_removed_behind_its_back(store, root):
    info = store.store(b"gone soon")
    (root / f"{info.artifact_id}.bin").unlink()
    with pytest.raises(ArtifactNotFound):
        store.retrieve(info.artifact_id)
    assert store.exists(info.artifact_id) is False


# --- symlinks and paths --------------------------------------------------------------


def test_it_refuses_a_symlink_escaping_the_sandbox(root, clock, tmp_path):
    store = ArtifactStore(root, clock=clock)
    info = store.store(b"innocent")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"innocent")  # same size and hash: only the symlink check can refuse it
    data_file = root / f"{info.artifact_id}.bin"
    data_file.unlink()
    data_file.symlink_to(secret)
    with pytest.raises(ArtifactError, match="refused") as exc:
        store.retrieve(info.artifact_id)
    assert not isinstance(exc.value, ArtifactNotFound)
    assert no_path_in(str(exc.value), root)
    assert exc.value.__cause__ is None and exc.value.__suppress_context__


def test_it_refuses_a_symlink_inside_the_sandbox_too(store, root):
    real = store.store(b"real")
    other = store.store(b"other")
    target = root / f"{real.artifact_id}.bin"
    link = root / f"{other.artifact_id}.bin"
    link.unlink()
    link.symlink_to(target)
    with pytest.raises(ArtifactError, match="refused"):
        store.retrieve(other.artifact_id)


def test_it_skips_symlinked_artifacts_on_restart(root, clock, tmp_path, caplog):
    store = ArtifactStore(root, clock=clock)
    info = store.store(b"data")
    outside = tmp_path / "outside.json"
    sidecar = root / f"{info.artifact_id}.json"
    outside.write_bytes(sidecar.read_bytes())
    sidecar.unlink()
    sidecar.symlink_to(outside)
    with caplog.at_level(logging.WARNING, logger="pipeline._artifacts"):
        reopened = ArtifactStore(root, clock=clock)
    assert len(reopened) == 0
    assert "skipping artifact" in caplog.text
    assert no_path_in(caplog.text, root)


def test_it_replaces_a_planted_symlink_when_storing(store, root, tmp_path):
    payload = b"payload to store"
    artifact_id = "artifact_" + hashlib.sha256(payload).hexdigest()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"must stay untouched")
    (root / f"{artifact_id}.bin").symlink_to(victim)
    store.store(payload)
    assert victim.read_bytes() == b"must stay untouched"
    assert not (root / f"{artifact_id}.bin").is_symlink()
    assert store.retrieve(artifact_id) == payload


def test_it_shows_no_real_path_in_repr_or_info(store, root):
    info = store.store(b"x")
    for text in (repr(store), repr(info), json.dumps(info.to_dict()), str(store.list())):
        assert no_path_in(text, root)


# --- restart -----------------------------------------------------------------------------


def test_it_sees_old_artifacts_after_a_restart(root, clock):
    first = ArtifactStore(root, clock=clock)
    a = first.store({"rows": [1, 2, 3]}, tool_call_id="call_a")
    clock.advance(10)
    b = first.store("text")
    clock.advance(10)
    first.retrieve(a.artifact_id)  # a is now the most recently accessed
    second = ArtifactStore(root, clock=clock)
    assert {i.artifact_id for i in second.list()} == {a.artifact_id, b.artifact_id}
    assert second.info(a.artifact_id) == first.info(a.artifact_id)
    assert second.retrieve_json(a.artifact_id) == {"rows": [1, 2, 3]}
    assert second.total_bytes == first.total_bytes
    assert second.info(a.artifact_id).last_accessed_at > second.info(b.artifact_id).last_accessed_at


@pytest.mark.parametrize(
    "sidecar",
    [b"{not json", b"[]", b'{"artifact_id": "artifact_0000000000000000"}', b"", b'{"size_bytes": "x"}', b"\xff\xfe"],
)
def test_it_skips_a_corrupt_sidecar_with_a_warning(root, clock, caplog, sidecar):
    store = ArtifactStore(root, clock=clock)
    bad = store.store(b"bad one")
    good = store.store(b"good one")
    (root / f"{bad.artifact_id}.json").write_bytes(sidecar)
    with caplog.at_level(logging.WARNING, logger="pipeline._artifacts"):
        reopened = ArtifactStore(root, clock=clock)
    assert [i.artifact_id for i in reopened.list()] == [good.artifact_id]
    assert bad.artifact_id in caplog.text
    assert no_path_in(caplog.text, root)


def test_it_skips_a_sidecar_whose_data_file_is_gone_or_resized(root, clock):
    store = ArtifactStore(root, clock=clock)
    gone = store.store(b"gone")
    resized = store.store(b"resized")
    (root / f"{gone.artifact_id}.bin").unlink()
    (root / f"{resized.artifact_id}.bin").write_bytes(b"different length now")
    assert len(ArtifactStore(root, clock=clock)) == 0


def test_it_ignores_stray_files_in_the_root(root, clock):
    root.mkdir(parents=True)
    (root / "notes.json").write_text("{}")
    (root / "artifact_XYZ.json").write_text("{}")
    (root / ".tmp-abandoned").write_bytes(b"half written")
    assert len(ArtifactStore(root, clock=clock)) == 0


# --- cleanup ------------------------------------------------------------------------------


def test_it_removes_expired_artifacts_with_fake_clock(root, clock):
    store = ArtifactStore(root, ttl_seconds=100, clock=clock)
    old = store.store(b"old")
    clock.advance(60)
    young = store.store(b"young")
    clock.advance(50)
    assert store.exists(old.artifact_id) is False  # expired reads as gone at once
    assert store.cleanup_expired() == 0  # ...and the read already removed it
    clock.advance(60)
    assert store.cleanup_expired() == 1
    assert store.list() == [] and store.total_bytes == 0
    assert not any(root.iterdir())
    assert young.expires_at == young.created_at + dt.timedelta(seconds=100)


def test_it_counts_expired_artifacts_in_cleanup_with_fake_clock(root, clock):
    store = ArtifactStore(root, ttl_seconds=10, clock=clock)
    for i in range(5):
        store.store(f"artifact {i}")
    clock.advance(11)
    assert store.cleanup_expired() == 5
    assert len(store) == 0


def test_it_keeps_artifacts_forever_without_ttl_with_fake_clock(root, clock):
    store = ArtifactStore(root, ttl_seconds=None, clock=clock)
    info = store.store(b"forever")
    clock.advance(10**9)
    assert store.cleanup_expired() == 0
    assert info.expires_at is None and store.retrieve(info.artifact_id) == b"forever"


def test_it_cleans_by_size_least_recently_accessed_first_down_to_low_water(root, clock):
    store = ArtifactStore(root, max_total_bytes=1000, low_water_ratio=0.5, clock=clock)
    ids = []
    for i in range(10):  # 10 x 100 bytes = exactly the limit
        ids.append(store.store(bytes([i]) * 100).artifact_id)
        clock.advance(1)
    for i in (0, 1, 2):  # the oldest three become the most recently accessed
        store.retrieve(ids[i])
        clock.advance(1)
    assert store.cleanup_by_size() == 0  # at the limit is not over it
    store._max_total = 999  # now over: clean to 500 bytes (low water 0.5 of 1000)
    assert store.cleanup_by_size() == 5
    assert store.total_bytes == 500
    assert {i.artifact_id for i in store.list()} == {ids[0], ids[1], ids[2], ids[8], ids[9]}


def test_it_cleans_by_size_on_store_and_keeps_the_new_artifact(root, clock):
    store = ArtifactStore(root, max_total_bytes=1000, low_water_ratio=0.8, clock=clock)
    ids = []
    for i in range(9):
        ids.append(store.store(bytes([i]) * 100).artifact_id)
        clock.advance(1)
    store.retrieve(ids[0])
    clock.advance(1)
    newest = store.store(b"N" * 300)  # 1200 bytes: over 1000, clean to <= 800
    remaining = {i.artifact_id for i in store.list()}
    assert newest.artifact_id in remaining and ids[0] in remaining
    assert store.total_bytes == 800
    assert remaining == {ids[0], ids[5], ids[6], ids[7], ids[8], newest.artifact_id}


def test_it_keeps_lru_order_across_a_restart(root, clock):
    store = ArtifactStore(root, max_total_bytes=300, low_water_ratio=0.34, clock=clock)
    a = store.store(b"a" * 100)
    clock.advance(1)
    b = store.store(b"b" * 100)
    clock.advance(1)
    c = store.store(b"c" * 100)
    clock.advance(1)
    store.retrieve(a.artifact_id)
    reopened = ArtifactStore(root, max_total_bytes=250, low_water_ratio=0.5, clock=clock)
    assert reopened.cleanup_by_size() == 2
    assert [i.artifact_id for i in reopened.list()] == [a.artifact_id]
    assert {b.artifact_id, c.artifact_id}.isdisjoint(p.stem for p in root.iterdir())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttl_seconds": 0},
        {"ttl_seconds": -1},
        {"ttl_seconds": "1"},
        {"max_total_bytes": 0},
        {"max_total_bytes": 1.5},
        {"low_water_ratio": 0},
        {"low_water_ratio": 1.5},
    ],
)
def test_it_refuses_bad_settings(root, kwargs):
    with pytest.raises(ConfigError):
        ArtifactStore(root, **kwargs)


def test_it_refuses_a_root_it_cannot_create(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ArtifactError) as exc:
        ArtifactStore(blocker / "artifacts")
    assert no_path_in(str(exc.value), tmp_path / "x")


# --- threads ------------------------------------------------------------------------------


def test_it_stores_from_many_threads(store):
    payloads = [f"payload {i} ".encode() * (i + 1) for i in range(64)]

    def work(i: int) -> str:
        info = store.store(payloads[i])
        assert store.retrieve(info.artifact_id) == payloads[i]
        store.store(payloads[(i + 1) % 64])  # the same content from another thread
        return info.artifact_id

    with ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(work, range(64)))
    assert len(set(ids)) == 64 and len(store) == 64
    assert store.total_bytes == sum(len(p) for p in payloads)
    for artifact_id, payload in zip(ids, payloads):
        assert store.retrieve(artifact_id) == payload


def test_it_starts_and_stops_the_cleaner_twice(root, clock):
    store = ArtifactStore(root, ttl_seconds=10, clock=clock)
    store.store(b"expires")
    clock.advance(11)
    removed = threading.Event()
    original = store.cleanup_expired

    def watched() -> int:
        count = original()
        if count:
            removed.set()
        return count

    store.cleanup_expired = watched  # type: ignore[method-assign]
    store.start_cleaner(interval_seconds=0.01)
    store.start_cleaner(interval_seconds=0.01)
    assert removed.wait(5)
    assert store.cleaner_running
    store.stop_cleaner()
    store.stop_cleaner()
    assert not store.cleaner_running
    assert len(store) == 0
    store.start_cleaner(interval_seconds=60)
    assert store.cleaner_running
    store.stop_cleaner()
    assert not store.cleaner_running


def test_it_stops_the_cleaner_as_a_context_manager(root, clock):
    with ArtifactStore(root, clock=clock) as store:
        store.start_cleaner(interval_seconds=60)
        assert store.cleaner_running
    assert not store.cleaner_running


def test_it_keeps_the_cleaner_alive_after_a_failing_pass(root, clock):
    store = ArtifactStore(root, clock=clock)
    passes = []

    def failing() -> int:
        passes.append(1)
        raise OSError("disk hiccup")

    store.cleanup_expired = failing  # type: ignore[method-assign]
    store.start_cleaner(interval_seconds=0.01)
    try:
        deadline = threading.Event()
        for _ in range(500):
            if len(passes) >= 3:
                break
            deadline.wait(0.01)
        assert len(passes) >= 3 and store.cleaner_running
    finally:
        store.stop_cleaner()


def test_it_rejects_a_bad_cleaner_interval(store):
    with pytest.raises(ConfigError, match="interval_seconds"):
        store.start_cleaner(interval_seconds=0)


def test_it_names_the_threshold():
    assert THRESHOLD_BYTES == 1024 * 1024
