"""Every tool-side form the design documents show, called as they write it (v2.1
first, v2.0 where v2.1 did not rename or delete it), asserting the documented
outputs. docs/design-conformance.md lists each one.

Each documented call is one snippet in ``tests/pipeline/design_examples_tools.py``
(``DOCUMENTED``), run as written in a fresh namespace (``tmp`` is a fresh directory);
``python -m tests.pipeline.design_examples_tools`` runs them all and prints how many
fail. Below them, a test for each defect fixed on the way.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from tests.pipeline.design_examples_tools import DOCUMENTED, run_documented
from pipeline import (
    ArtifactError,
    ArtifactNotFound,
    ArtifactStore,
    ConfigError,
    DataFileManager,
    DataStorage,
    InvalidArtifactId,
    OutputLevel,
    ThreadSafeMixin,
    TimeoutException,
    ToolErrorType,
    ToolExecutionResult,
    ToolExecutor,
    ToolInvocationRequest,
    ToolRetryPolicy,
    ToolTimeoutHandler,
    open_store,
)


@pytest.mark.parametrize(("name", "where", "code"), DOCUMENTED, ids=[d[0] for d in DOCUMENTED])
def test_it_runs_the_documented_call_as_written(name, where, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    run_documented(code, str(store_dir))


# --------------------------------------------------------------------------- defects fixed

BIG = [{"id": i, "name": "x" * 2000} for i in range(1000)]  # about 2 MB as JSON


def test_it_refuses_a_storage_dir_that_cannot_hold_a_store_at_once(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ArtifactError):
        ToolExecutionResult.from_raw_data("call_1", BIG, OutputLevel.FULL, str(blocker / "artifacts"))
    with pytest.raises(ArtifactError):
        ToolExecutionResult.from_raw_data("call_1", BIG, OutputLevel.FULL, storage_dir=str(blocker))
    with pytest.raises(TypeError, match="storage_dir must be a directory path or an ArtifactStore"):
        ToolExecutionResult.from_raw_data("call_1", BIG, OutputLevel.FULL, 42)
    with pytest.raises(TypeError, match="not both"):
        ToolExecutionResult.from_raw_data("call_1", BIG, OutputLevel.FULL, str(tmp_path), storage=str(tmp_path))


def test_it_never_inlines_megabytes_when_a_working_store_fails(tmp_path):
    tiny = ArtifactStore(tmp_path / "tiny", max_total_bytes=1000, auto_clean=False)  # refuses 2 MB
    result = ToolExecutionResult.from_raw_data("call_1", BIG, OutputLevel.FULL, tiny)
    assert result.success and result.artifact_id is None
    assert len(result.observation) < 2000 and result.observation.startswith("Found 1000 items:")
    assert result.warnings[0].startswith("artifact_store_failed: ArtifactError")


def test_it_stores_through_a_shared_store_per_directory_and_keeps_the_path_private(tmp_path):
    first = ToolExecutionResult.from_raw_data("call_1", BIG, OutputLevel.BRIEF, str(tmp_path))
    assert open_store(tmp_path) is open_store(str(tmp_path / "." ))
    assert open_store(tmp_path).retrieve_json(first.artifact_id) == BIG
    assert first._data_file == str(tmp_path.resolve() / f"{first.artifact_id}.bin")
    dumped = first.model_dump_json()
    assert "_data_file" not in dumped and str(tmp_path) not in dumped + first.observation


def test_it_answers_an_unusable_request_storage_dir_without_running_the_tool(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    ran = []
    executor = ToolExecutor()
    executor.register("write_report", lambda: ran.append(1) or "done")
    result = executor.execute(ToolInvocationRequest(tool_call_id="call_1", tool_name="write_report",
                                                    storage_dir=str(blocker / "sub")))
    assert not result.success and result.error_type == "invalid_parameters"
    assert "storage_dir cannot hold artifacts" in result.error_message and not ran


async def _async_rows(region: str) -> list:
    await asyncio.sleep(0)
    return [{"region": region, "month": m} for m in range(1, 13)]


def test_it_runs_an_async_tool_to_completion_in_execute():
    executor = ToolExecutor()
    executor.register("rows", _async_rows)
    result = executor.execute(ToolInvocationRequest(tool_call_id="call_1", tool_name="rows",
                                                    parameters={"region": "East"}, output_level="brief"))
    assert result.success and result.observation == "Found 12 items"
    assert "coroutine" not in result.observation


def test_it_awaits_an_async_tool_on_the_callers_loop_in_aexecute():
    loops = []

    async def where() -> str:
        loops.append(asyncio.get_running_loop())
        return "here"

    executor = ToolExecutor()
    executor.register("where", where)
    executor.register("sync_rows", lambda: [1, 2, 3])

    async def agent():
        result = await executor.aexecute(ToolInvocationRequest(tool_call_id="c1", tool_name="where"))
        sync = await executor.aexecute(ToolInvocationRequest(tool_call_id="c2", tool_name="sync_rows",
                                                             output_level="brief"))
        return result, sync, asyncio.get_running_loop()

    result, sync, loop = asyncio.run(agent())
    assert result.success and result.observation == "here" and loops == [loop]
    assert sync.success and sync.observation == "Found 3 items"


def test_it_times_out_and_retries_an_async_tool_in_both_paths():
    calls = []

    async def slow():
        calls.append(1)
        await asyncio.sleep(5)

    executor = ToolExecutor(retry_policy=ToolRetryPolicy(max_retries=1, initial_delay_ms=0), sleep=lambda s: None)
    executor.register("slow", slow, timeout_ms=50)
    request = ToolInvocationRequest(tool_call_id="call_1", tool_name="slow")
    result = executor.execute(request)
    assert (result.success, result.error_type, result.retry_count) == (False, "timeout", 1) and len(calls) == 2
    result = asyncio.run(executor.aexecute(request))
    assert (result.success, result.error_type, result.retry_count) == (False, "timeout", 1) and len(calls) == 4


def test_it_classifies_an_async_tools_exception_and_awaits_a_returned_coroutine():
    async def broken():
        raise PermissionError("no access to the warehouse")

    executor = ToolExecutor()
    executor.register("broken", broken)
    executor.register("indirect", lambda: _async_rows("West"))  # a def that returns a coroutine
    failed = executor.execute(ToolInvocationRequest(tool_call_id="c1", tool_name="broken"))
    assert failed.error_type == "permission_denied" and "no access" in failed.error_message
    ok = executor.execute(ToolInvocationRequest(tool_call_id="c2", tool_name="indirect", output_level="brief"))
    assert ok.success and ok.observation == "Found 12 items"


@pytest.fixture
def cleaner(monkeypatch):
    """A cleaner of this test's own (the process-wide one also serves other tests' stores)."""
    from pipeline import _artifacts

    own = _artifacts._Cleaner()
    own._POLL = 0.05
    monkeypatch.setattr(_artifacts, "_CLEANER", own)
    return own


def test_it_runs_the_cleaner_by_default_on_one_daemon_thread_and_stops_it(tmp_path, cleaner):
    stores = [ArtifactStore(tmp_path / str(i)) for i in range(20)]
    assert not any(s.cleaner_running for s in stores)  # started lazily, at the first store
    assert cleaner._thread is None
    for store in stores:
        store.store(b"data")
    assert all(s.cleaner_running for s in stores)
    thread = cleaner._thread
    assert thread.daemon and thread.name == "ArtifactStore-cleaner"
    assert sum(1 for t in threading.enumerate() if t is thread) == 1 and len(cleaner._due) == 20
    for store in stores:
        store.close()
    assert not any(s.cleaner_running for s in stores)
    thread.join(5)
    assert not thread.is_alive()


def test_it_lets_the_cleaner_thread_end_when_its_stores_are_gone(tmp_path, cleaner):
    store = ArtifactStore(tmp_path / "a")
    store.store(b"data")
    thread = cleaner._thread
    assert thread.is_alive()
    del store
    gc.collect()
    thread.join(5)
    assert not thread.is_alive() and not cleaner._due


def test_it_cleans_on_the_shared_thread_at_each_stores_interval(tmp_path, cleaner):
    clock = [1000.0]
    store = ArtifactStore(tmp_path, ttl_seconds=10, clock=lambda: clock[0], auto_clean=False)
    store.store(b"expires")
    clock[0] += 11
    store.start_cleaner(interval_seconds=0.01)
    for _ in range(500):
        if len(store) == 0:
            break
        time.sleep(0.01)
    assert len(store) == 0
    store.close()


def test_it_does_not_start_the_cleaner_when_told_not_to_or_after_a_stop(tmp_path):
    off = ArtifactStore(tmp_path / "off", auto_clean=False)
    off.store(b"x")
    assert not off.cleaner_running
    stopped = ArtifactStore(tmp_path / "stopped")
    stopped.stop_cleaner()
    stopped.store(b"x")
    assert not stopped.cleaner_running
    with pytest.raises(ConfigError, match="clean_interval_seconds"):
        ArtifactStore(tmp_path / "bad", clean_interval_seconds=0)


def test_it_removes_a_conversations_artifacts_when_it_ends_unless_another_holds_them(tmp_path):
    store = ArtifactStore(tmp_path, auto_clean=False)
    shared = store.store(b"same bytes", conversation_id="conv-1")
    store.store(b"same bytes", conversation_id="conv-2")
    own = store.store(b"only conv-1", conversation_id="conv-1")
    untied = store.store(b"no conversation")
    assert store.info(shared.artifact_id).conversation_ids == ("conv-1", "conv-2")
    assert store.cleanup_conversation("conv-1") == 1
    assert store.exists(shared.artifact_id) and not store.exists(own.artifact_id)
    assert ArtifactStore(tmp_path, auto_clean=False).info(shared.artifact_id).conversation_ids == ("conv-2",)
    assert store.end_conversation("conv-2") == 1
    assert not store.exists(shared.artifact_id) and store.exists(untied.artifact_id)


def test_it_cleans_a_conversation_through_the_executor(tmp_path):
    executor = ToolExecutor(artifact_store=str(tmp_path / "own"), conversation_id="conv-9")
    executor.register("rows", lambda: [{"id": i} for i in range(20)])
    kept = executor.execute(ToolInvocationRequest(tool_call_id="c1", tool_name="rows", output_level="full"))
    other = executor.execute(ToolInvocationRequest(tool_call_id="c2", tool_name="rows", output_level="full",
                                                   storage_dir=str(tmp_path / "request")),
                             conversation_id="conv-10")
    assert executor.end_conversation() == 1 and not executor.artifact_store.exists(kept.artifact_id)
    assert open_store(tmp_path / "request").exists(other.artifact_id)
    assert executor.end_conversation("conv-10") == 1
    assert not open_store(tmp_path / "request").exists(other.artifact_id)
    with pytest.raises(ConfigError):
        ToolExecutor().end_conversation()


def test_it_lets_stores_on_one_folder_see_what_the_other_wrote_later(tmp_path):
    reader = ArtifactStore(tmp_path, auto_clean=False)
    writer = ArtifactStore(tmp_path, auto_clean=False)
    info = writer.store({"rows": [1, 2]}, conversation_id="conv-1")
    assert reader.exists(info.artifact_id)
    assert reader.retrieve_json(info.artifact_id) == {"rows": [1, 2]}
    assert [i.artifact_id for i in reader.list()] == [info.artifact_id]
    assert reader.total_bytes == writer.total_bytes
    assert reader.cleanup_conversation("conv-1") == 1
    assert not writer.exists(info.artifact_id) and writer.list() == []


def test_it_sizes_input_by_its_content_not_the_outer_dict():
    # the design's sys.getsizeof counted only the dict: 20 MB under one key passed
    assert not ToolTimeoutHandler.validate_input_size({"blob": "x" * (20 * 1024 * 1024)})


def test_it_raises_a_real_timeout_exception_not_an_enum_member():
    with pytest.raises(TimeoutException) as caught:
        ToolTimeoutHandler.execute_with_timeout(lambda: time.sleep(0.5), "call_1", timeout_ms=20)
    assert isinstance(caught.value, TimeoutError)


def test_it_cleans_by_size_only_down_to_the_low_water_mark(tmp_path, monkeypatch):
    monkeypatch.setattr(DataFileManager, "STORAGE_DIR", tmp_path)
    monkeypatch.setattr(DataFileManager, "METADATA_FILE", tmp_path / ".metadata.json")
    manager = DataFileManager(max_size_gb=1000 / 1024**3, auto_start=False)  # 1000 bytes
    paths = []
    for i in range(10):
        path = tmp_path / f"f{i}.json"
        path.write_bytes(b"x" * 200)
        manager.register_file(path, {"size_bytes": 200})
        paths.append(path)
    manager.touch_file(paths[0])  # the oldest becomes the most recently used
    assert manager.cleanup_by_size() == 6  # 2000 -> 800 bytes (80 %), not everything
    assert [p.exists() for p in paths] == [True] + [False] * 6 + [True] * 3


def test_it_restarts_the_file_managers_daemon_after_a_stop(tmp_path, monkeypatch, cleaner):
    # the design's stop left its shutdown event set: a restarted daemon exited at once
    monkeypatch.setattr(DataFileManager, "STORAGE_DIR", tmp_path)
    monkeypatch.setattr(DataFileManager, "METADATA_FILE", tmp_path / ".metadata.json")
    manager = DataFileManager(auto_start=True)
    assert cleaner.running(manager)
    manager.stop_cleanup_daemon()
    assert not cleaner.running(manager)
    manager.start_cleanup_daemon()
    assert cleaner.running(manager)
    manager.stop_cleanup_daemon()


def test_it_stops_at_once_when_the_design_would_have_deleted_nothing(tmp_path, monkeypatch):
    # 1.2 x the limit: the design's stop test was true before the first deletion
    monkeypatch.setattr(DataFileManager, "STORAGE_DIR", tmp_path)
    monkeypatch.setattr(DataFileManager, "METADATA_FILE", tmp_path / ".metadata.json")
    manager = DataFileManager(max_size_gb=1000 / 1024**3, auto_start=False)
    for i in range(6):
        path = tmp_path / f"f{i}.json"
        path.write_bytes(b"x" * 200)
        manager.register_file(path, {"size_bytes": 200})
    assert manager.cleanup_by_size() == 2  # 1200 -> 800


def test_it_remembers_managed_files_across_a_restart_and_refuses_paths_outside(tmp_path, monkeypatch):
    monkeypatch.setattr(DataFileManager, "STORAGE_DIR", tmp_path / "data")
    monkeypatch.setattr(DataFileManager, "METADATA_FILE", tmp_path / "data" / ".metadata.json")
    first = DataFileManager(auto_start=False)
    path = tmp_path / "data" / "report.csv"
    path.write_text("a,b")
    first.register_file(str(path), {"conversation_id": "conv-1"})
    again = DataFileManager(auto_start=False)  # the design never reloaded its metadata
    assert again.cleanup_conversation("conv-1") == 1 and not path.exists()
    with pytest.raises(ArtifactError):
        again.register_file(str(tmp_path / "elsewhere.txt"), {})
    with pytest.raises(ArtifactError):
        again.register_file("../../etc/passwd", {})


def test_it_gives_a_mixin_user_a_lock_even_without_super_init():
    class Forgetful(ThreadSafeMixin):
        def __init__(self):
            self.items = []

    obj = Forgetful()
    with obj._with_lock():
        obj.items.append(1)
    assert obj._lock is obj._lock


def test_it_refuses_documented_storage_paths_that_are_not_artifact_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(DataStorage, "STORAGE_DIR", tmp_path)
    with pytest.raises(InvalidArtifactId):
        DataStorage.retrieve_data("../../etc/passwd")
    with pytest.raises(ArtifactNotFound):
        DataStorage.retrieve_data("artifact_" + "0" * 64)
    text_id = DataStorage.store_large_data("call_1", "纯文本", None)
    assert DataStorage.retrieve_data(text_id) == "纯文本"


def test_it_retries_every_transient_error_by_default():
    # the design's default retried only TIMEOUT and RESOURCE_ERROR
    policy = ToolRetryPolicy()
    assert all(policy.should_retry(t, 0) for t in ToolErrorType if t.is_retryable)


def test_it_uploads_artifacts_stored_in_a_requests_storage_dir(tmp_path, collector):
    from pipeline import RecordExporter, hook_executor

    executor = ToolExecutor()  # no store of its own: the request names one
    executor.register("rows", lambda: [{"id": i} for i in range(30)])
    exporter = RecordExporter(collector.url, "key")
    hook_executor(executor, exporter=exporter, conversation_id="conv-1")
    result = executor.execute(ToolInvocationRequest(tool_call_id="c1", tool_name="rows", output_level="full",
                                                    storage_dir=str(tmp_path)))
    assert exporter.flush(10)
    exporter.shutdown(5)
    assert collector.artifacts[result.artifact_id] == open_store(tmp_path).retrieve(result.artifact_id)
