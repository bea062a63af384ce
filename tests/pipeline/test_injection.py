"""LockManager (reference-counted per-key locks) and MessageInjectionProtocol.

The agent state here is a fake of the agent framework's state object (LangGraph's
get_state/update_state), the edge this module talks to.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from pipeline import LockManager, MessageInjectionProtocol, SkillActivationRequest, SkillActivator, SkillLoader
from pipeline._exceptions import LockTimeoutError, PipelineError
from pipeline._injection import MAX_INJECTED_MESSAGES, get_lock_manager
from pipeline._tokens import DynamicTokenCounter

inject = MessageInjectionProtocol.inject_into_state


@pytest.fixture(autouse=True)
def frequent_thread_switches() -> Iterator[None]:
    """Make races likely so a missing lock shows up as lost messages."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


class FakeAgentState:
    """The agent framework's state with LangGraph's signatures (``get_state(config)``,
    ``update_state(config, values)``; the real graph is in test_design_examples_context):
    read the whole state, write a new message list.

    ``get_state`` yields the thread between read and return so unlocked
    read-modify-write cycles would interleave and lose updates.
    """

    def __init__(self, messages: list[Any] | None = None) -> None:
        self.messages: list[Any] = list(messages or [])
        self.updates = 0

    def get_state(self, config) -> dict[str, Any]:
        assert set(config) == {"configurable"} and config["configurable"]["thread_id"]
        snapshot = {"messages": list(self.messages)}
        time.sleep(0)
        return snapshot

    def update_state(self, config, values: dict[str, Any]) -> None:
        time.sleep(0)
        self.messages = values["messages"]
        self.updates += 1


class FakeSnapshot:
    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values


class FakeLangGraphLikeState(FakeAgentState):
    """get_state returns a StateSnapshot-like object with ``.values``."""

    def get_state(self, config) -> FakeSnapshot:  # type: ignore[override]
        return FakeSnapshot({"messages": list(self.messages)})


class FakeAttributeState(FakeAgentState):
    """get_state returns an object with a ``messages`` attribute."""

    def get_state(self, config) -> Any:  # type: ignore[override]
        return self


def msg(content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


# --- LockManager ---------------------------------------------------------------------


def test_it_counts_references_and_removes_the_lock_at_zero() -> None:
    manager = LockManager()
    with manager.lock("conv-1"):
        assert manager.ref_count("conv-1") == 1
        assert len(manager) == 1
        with manager.lock("conv-1"):  # re-entrant in one thread
            assert manager.ref_count("conv-1") == 2
        assert manager.ref_count("conv-1") == 1
    assert manager.ref_count("conv-1") == 0
    assert len(manager) == 0


def test_it_releases_and_cleans_up_when_the_block_raises() -> None:
    manager = LockManager()
    with pytest.raises(ValueError):
        with manager.lock("conv-1"):
            raise ValueError("boom")
    assert len(manager) == 0
    with manager.lock("conv-1", timeout=0):  # really released
        pass


def test_it_never_replaces_a_held_lock_while_other_keys_churn() -> None:
    manager = LockManager()
    holding = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with manager.lock("conv-held"):
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(10)
    for number in range(5000):  # far more keys than the seeds' LRU kept
        with manager.lock(f"conv-{number}"):
            pass
    assert len(manager) == 1 and manager.ref_count("conv-held") == 1
    # Still the same, held lock: another thread cannot get in.
    outcome: list[str] = []

    def intruder() -> None:
        try:
            with manager.lock("conv-held", timeout=0):
                outcome.append("entered")
        except LockTimeoutError:
            outcome.append("refused")

    other = threading.Thread(target=intruder)
    other.start()
    other.join(10)
    assert outcome == ["refused"]
    assert manager.ref_count("conv-held") == 1  # the refused waiter let go of its reference
    release.set()
    thread.join(10)
    assert len(manager) == 0


def test_it_gives_mutual_exclusion_per_key_under_contention() -> None:
    manager = LockManager()
    counters = {"a": 0, "b": 0}

    def work(key: str) -> None:
        for _ in range(200):
            with manager.lock(key):
                value = counters[key]
                time.sleep(0)
                counters[key] = value + 1

    threads = [threading.Thread(target=work, args=("a" if i % 2 else "b",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert counters == {"a": 800, "b": 800}
    assert len(manager) == 0


def test_it_raises_a_pipeline_timeout_error() -> None:
    assert issubclass(LockTimeoutError, PipelineError) and issubclass(LockTimeoutError, TimeoutError)


# --- MessageInjectionProtocol --------------------------------------------------------


def test_it_appends_messages_to_a_fake_agent_state() -> None:
    state = FakeAgentState([msg("hello")])
    manager = LockManager()
    assert inject([msg("skill loading"), msg("body", isMeta=True)], "conv-1", state, manager)
    assert [m["content"] for m in state.messages] == ["hello", "skill loading", "body"]
    assert state.messages[2]["isMeta"] is True
    assert len(manager) == 0


def test_it_copies_the_injected_messages() -> None:
    state = FakeAgentState()
    original = msg("body")
    assert inject([original], "conv-1", state, LockManager())
    original["content"] = "changed later"
    assert state.messages[0]["content"] == "body"


@pytest.mark.parametrize("state_class", [FakeLangGraphLikeState, FakeAttributeState])
def test_it_reads_messages_from_snapshot_or_attribute_fake_states(state_class: type) -> None:
    state = state_class([msg("first")])
    assert inject([msg("second")], "conv-1", state, LockManager())
    assert [m["content"] for m in state.messages] == ["first", "second"]


def test_it_treats_a_state_without_messages_as_empty() -> None:
    class EmptyState:
        def __init__(self) -> None:
            self.written: dict[str, Any] = {}

        def get_state(self, config) -> dict[str, Any]:
            return {}

        def update_state(self, config, values: dict[str, Any]) -> None:
            self.written = values

    state = EmptyState()
    assert inject([msg("x")], "conv-1", state, LockManager())
    assert state.written == {"messages": [msg("x")]}


@pytest.mark.parametrize(
    "messages",
    [
        "not a list",
        None,
        [42],
        ["a string"],
        [{"content": "no role"}],
        [{"role": "wizard", "content": "x"}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": ["blocks"]}],
        [{"role": "user", "content": "x", "isMeta": "yes"}],
        [msg("ok"), {"role": "user"}],
        [msg(str(i)) for i in range(MAX_INJECTED_MESSAGES + 1)],
    ],
)
def test_it_refuses_malformed_messages_and_leaves_the_state_alone(
    messages: Any, caplog: pytest.LogCaptureFixture
) -> None:
    state = FakeAgentState([msg("kept")])
    with caplog.at_level(logging.ERROR, logger="pipeline._injection"):
        assert inject(messages, "conv-1", state, LockManager()) is False
    assert state.messages == [msg("kept")] and state.updates == 0
    assert "refused" in caplog.text


@pytest.mark.parametrize("state", [object(), None, {"messages": []}, "state"])
def test_it_returns_false_for_a_state_without_get_and_update(
    state: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="pipeline._injection"):
        assert inject([msg("x")], "conv-1", state, LockManager()) is False
    assert "get_state()/update_state()" in caplog.text


@pytest.mark.parametrize("conversation_id", ["", None, 42])
def test_it_refuses_a_bad_conversation_id(conversation_id: Any) -> None:
    assert inject([msg("x")], conversation_id, FakeAgentState(), LockManager()) is False


def test_it_returns_false_when_the_fake_state_fails(caplog: pytest.LogCaptureFixture) -> None:
    class ReadFails(FakeAgentState):
        def get_state(self, config) -> dict[str, Any]:
            raise RuntimeError("checkpointer down")

    class WriteFails(FakeAgentState):
        def update_state(self, config, values: dict[str, Any]) -> None:
            raise RuntimeError("write refused")

    class NotAList(FakeAgentState):
        def get_state(self, config) -> dict[str, Any]:
            return {"messages": "oops"}

    manager = LockManager()
    with caplog.at_level(logging.ERROR, logger="pipeline._injection"):
        assert inject([msg("x")], "conv-1", ReadFails(), manager) is False
        assert inject([msg("x")], "conv-1", WriteFails(), manager) is False
        assert inject([msg("x")], "conv-1", NotAList(), manager) is False
    assert "checkpointer down" in caplog.text and "write refused" in caplog.text
    assert len(manager) == 0


def test_it_gives_up_when_the_conversation_stays_locked() -> None:
    manager = LockManager()
    state = FakeAgentState()
    locked = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with manager.lock("conv-1"):
            locked.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(10)
    assert inject([msg("x")], "conv-1", state, manager, timeout=0) is False
    assert inject([msg("y")], "conv-2", state, manager, timeout=0) is True  # other conversations go on
    done.set()
    thread.join(10)
    assert [m["content"] for m in state.messages] == ["y"]
    assert len(manager) == 0


def test_it_loses_no_message_when_many_threads_inject_into_one_fake_state() -> None:
    manager = LockManager()
    state = FakeAgentState()
    results: list[bool] = []

    def worker(number: int) -> None:
        for index in range(40):
            results.append(inject([msg(f"{number}-{index}")], "conv-shared", state, manager))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(results) and len(results) == 480
    contents = [m["content"] for m in state.messages]
    assert sorted(contents) == sorted(f"{n}-{i}" for n in range(12) for i in range(40))
    for number in range(12):  # each thread's messages stay in its order
        own = [c for c in contents if c.startswith(f"{number}-")]
        assert own == [f"{number}-{i}" for i in range(40)]
    assert len(manager) == 0


def test_it_keeps_conversations_apart_across_threads() -> None:
    manager = LockManager()
    states = {f"conv-{n}": FakeAgentState() for n in range(6)}

    results: list[bool] = []

    def worker(conversation_id: str, tag: int) -> None:
        for index in range(30):
            batch = [msg(f"{tag}-{index}"), msg("meta", isMeta=True)]
            results.append(inject(batch, conversation_id, states[conversation_id], manager))

    threads = [threading.Thread(target=worker, args=(f"conv-{n % 6}", n)) for n in range(18)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(results) and len(results) == 18 * 30
    for n, state in enumerate(states.values()):
        tags = {t for t in range(18) if t % 6 == n}
        assert len(state.messages) == 3 * 30 * 2
        assert {m["content"].split("-")[0] for m in state.messages if m["content"] != "meta"} == {str(t) for t in tags}
    assert len(manager) == 0


def test_it_uses_the_process_lock_manager_by_default() -> None:
    state = FakeAgentState()
    assert inject([msg("x")], "conv-default", state)
    assert get_lock_manager().ref_count("conv-default") == 0
    assert state.messages == [msg("x")]


def test_it_injects_a_real_skill_activation_into_a_fake_agent_state() -> None:
    loader = SkillLoader(Path(__file__).parent / "skills_fixtures", token_counter=DynamicTokenCounter())
    result = SkillActivator(loader).activate(SkillActivationRequest(skill_name="sales-report"))
    state = FakeAgentState([msg("make the March sales report")])
    assert inject(result.to_llm_messages(), "conv-1", state, LockManager())
    assert state.messages[1]["content"].startswith('The "sales-report" skill is loading')
    assert state.messages[2]["isMeta"] is True and state.messages[2]["content"].startswith("# Sales report")


# --- a real compiled LangGraph graph with a checkpointer ----------------------------------


def test_it_injects_into_a_langgraph_state_without_a_reducer_and_into_a_fresh_thread() -> None:
    from typing import TypedDict

    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.memory import MemorySaver
    from langgraph.graph import END, START, StateGraph

    class PlainState(TypedDict):
        messages: list  # no reducer: update_state replaces the list

    def agent(state: PlainState) -> dict[str, Any]:
        return {"messages": state["messages"] + [AIMessage("done")]}

    builder = StateGraph(PlainState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    graph = builder.compile(checkpointer=MemorySaver())
    config = {"configurable": {"thread_id": "conv-plain"}}
    graph.invoke({"messages": [HumanMessage("hi")]}, config)
    assert inject([msg("skill says"), msg("hidden", isMeta=True)], "conv-plain", graph)
    messages = graph.get_state(config).values["messages"]
    assert [m.content for m in messages] == ["hi", "done", "skill says", "hidden"]
    assert isinstance(messages[2], HumanMessage) and messages[3].additional_kwargs == {"isMeta": True}

    # a thread the graph never ran: the snapshot is empty, the messages go in as LangChain messages
    assert inject([msg("first")], "conv-new", graph)
    fresh = graph.get_state({"configurable": {"thread_id": "conv-new"}}).values["messages"]
    assert [type(m).__name__ for m in fresh] == ["HumanMessage"] and fresh[0].content == "first"


def test_it_leaves_a_langgraph_state_untouched_when_a_message_cannot_convert(caplog: pytest.LogCaptureFixture) -> None:
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.memory import MemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [AIMessage("hello")]})
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    graph = builder.compile(checkpointer=MemorySaver())
    config = {"configurable": {"thread_id": "conv-x"}}
    graph.invoke({"messages": [("user", "hi")]}, config)
    before = graph.get_state(config).values["messages"]
    with caplog.at_level(logging.ERROR, logger="pipeline._injection"):
        assert not inject([msg("ok"), {"role": "assistant", "content": "x", "additional_kwargs": "not a dict"}], "conv-x", graph)
    assert graph.get_state(config).values["messages"] == before
    assert "failed" in caplog.text
