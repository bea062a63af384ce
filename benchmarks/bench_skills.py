"""Skills and injection: what progressive disclosure saves and what it costs.

Prints, for the demo skills and a generated set of 200 skills: tokens loaded at
level 1 / 2 / 3, the time to list skills (cold and with the metadata cache), to
load a body and a resource, to run a full activation; and injection throughput of
MessageInjectionProtocol with 16 threads over 1 and over 64 conversations.

Run: .venv/bin/python -m benchmarks.bench_skills
"""

from __future__ import annotations

from functools import partial
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks import run_threads
from pipeline import (
    LockManager,
    MessageInjectionProtocol,
    SkillActivationRequest,
    SkillActivator,
    SkillLoader,
)
from pipeline._tokens import get_token_counter

DEMO_SKILLS = Path(__file__).resolve().parent.parent / "pipeline" / "demo" / "skills"
BODY = (
    "## Step {n}\nQuery the orders table for the period the user names, group by region and "
    "product, and check totals against the monthly ledger before reporting.\n"
)


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def generate_skills(root: Path, count: int) -> None:
    for n in range(count):
        folder = root / f"skill-{n:03d}"
        (folder / "references").mkdir(parents=True)
        body = "".join(BODY.format(n=i) for i in range(40))
        (folder / "SKILL.md").write_text(
            f"---\nname: skill-{n:03d}\ndescription: \"Generated skill {n} for the benchmark: "
            f"monthly revenue analysis by region.\"\nallowed_tools: [query_database]\n---\n# Skill {n}\n{body}",
            encoding="utf-8",
        )
        (folder / "references" / "notes.md").write_text(body * 3, encoding="utf-8")


class MemoryState:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    def get_state(self) -> dict[str, Any]:
        return {"messages": self.messages}

    def update_state(self, values: dict[str, Any]) -> None:
        self.messages = values["messages"]


def injection_rate(conversations: int, threads: int = 16, per_thread: int = 500) -> tuple[float, int]:
    manager = LockManager()
    states = [MemoryState() for _ in range(conversations)]
    batch = [{"role": "user", "content": "skill loading"}, {"role": "user", "content": "body", "isMeta": True}]

    def work(worker: int) -> None:
        for index in range(per_thread):
            target = (worker + index) % conversations
            MessageInjectionProtocol.inject_into_state(batch, f"conv-{target}", states[target], manager)

    elapsed = run_threads([partial(work, n) for n in range(threads)])
    stored = sum(len(s.messages) for s in states)
    assert stored == threads * per_thread * len(batch), "lost messages"
    assert len(manager) == 0, "lock table not empty"
    return threads * per_thread / elapsed, stored


def main() -> None:
    counter = get_token_counter()
    demo = SkillLoader(DEMO_SKILLS, token_counter=counter)
    activator = SkillActivator(demo)
    print("demo skills: tokens loaded per level")
    for metadata in demo.list_skills():
        levels = []
        for level in (1, 2, 3):
            resources = demo.list_resources(metadata.name) if level == 3 else []
            result = activator.activate(
                SkillActivationRequest(skill_name=metadata.name, load_level=level, resources=resources)
            )
            levels.append(result.tokens_loaded)
        print(f"  {metadata.name:<18} L1 {levels[0]:>5}  L2 {levels[1]:>5}  L3 {levels[2]:>5}")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generate_skills(root, 200)
        cold = timed(lambda: SkillLoader(root, token_counter=counter).list_skills(), repeat=5)
        loader = SkillLoader(root, token_counter=counter)
        loader.list_skills()
        warm = timed(loader.list_skills, repeat=20)
        every = loader.list_skills()
        level1_total = sum(m.tokens for m in every)
        level2_total = sum(loader.load_full(m.name).tokens for m in every)
        print("\n200 generated skills")
        print(f"  all metadata (L1) {level1_total:,} tokens vs all bodies (L2) {level2_total:,} tokens")
        print(f"  list_skills cold  {cold:8.2f} ms   cached {warm:8.2f} ms")
        print(f"  load_full         {timed(lambda: loader.load_full('skill-100'), 200):8.3f} ms")
        print(
            f"  load_resource     {timed(lambda: loader.load_resource('skill-100', 'references/notes.md'), 200):8.3f} ms"
        )
        activate = SkillActivator(loader)
        request = SkillActivationRequest(skill_name="skill-100", load_level=2)
        print(f"  activate (L2)     {timed(lambda: activate.activate(request), 200):8.3f} ms")

    print("\ninjection, 16 threads x 500 injections of 2 messages")
    for conversations in (1, 64):
        rate, stored = injection_rate(conversations)
        print(f"  {conversations:>2} conversation(s): {rate:10,.0f} injections/s ({stored:,} messages, none lost)")


if __name__ == "__main__":
    main()
