"""The demo's regression run: a small dataset made from the agent's own answers, kept
as JSON Lines (``pipeline.write_dataset`` / ``read_dataset``) and in the dashboard
(``send_dataset`` / ``fetch_dataset``), then replayed: each item's scenario is run
again by a fresh agent and its answers compared with the expected ones, as an
agent's test suite would with a dataset taken from production.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .. import DatasetItem, RoundRecord
from .agent import DemoAgent
from .model import ScriptedModel
from .scenarios import SCENARIOS

DATASET_NAME = "demo regression"
DATASET_SCENARIO = "revenue_by_region"  # answers read from the fixed-seed sales data: the same every run


class _Rounds:
    """An exporter stand-in that keeps the round records (the answers) and drops the rest."""

    def __init__(self) -> None:
        self.rounds: list[RoundRecord] = []

    def submit(self, record: Any) -> None:
        if isinstance(record, RoundRecord):
            self.rounds.append(record)

    def upload_artifact(self, *args: Any) -> None:
        pass


def _answers(scenario_key: str, database: Path, artifact_dir: Path) -> list[RoundRecord]:
    """The rounds of one scenario run by a fresh agent that reports nowhere."""
    scenario = next(s for s in SCENARIOS if s.key == scenario_key)
    rounds = _Rounds()
    agent = DemoAgent.create(model=ScriptedModel(), database_path=database, artifact_dir=artifact_dir,
                             exporter=rounds)
    agent.run_conversation(scenario, conversation_id=f"dataset-{scenario_key}", user_id="regression")
    return sorted(rounds.rounds, key=lambda record: record.index)


def demo_dataset(database: Path, artifact_dir: Path) -> list[DatasetItem]:
    """One item per round of DATASET_SCENARIO: the user's question as input, the
    answer given as the recorded and the expected output."""
    return [
        DatasetItem(
            item_id=f"{DATASET_SCENARIO}-r{record.index}",
            input={"scenario": DATASET_SCENARIO, "round": record.index, "user_message": record.user_message},
            output={"final_answer": record.final_answer},
            expected_output={"final_answer": record.final_answer},
            source={"conversation_id": record.conversation_id, "round_id": record.round_id},
        )
        for record in _answers(DATASET_SCENARIO, database, artifact_dir)
    ]


@dataclass
class ReplayOutcome:
    items: int = 0
    passed: int = 0
    failures: list[str] = field(default_factory=list)  # item ids whose answer differs


def replay(items: Iterable[DatasetItem], database: Path, artifact_dir: Path) -> ReplayOutcome:
    """Run each item's scenario again and compare each round's answer with the expected one."""
    outcome = ReplayOutcome()
    by_scenario: dict[str, list[DatasetItem]] = defaultdict(list)
    for item in items:
        by_scenario[str(item.input.get("scenario", ""))].append(item)
    for key, wanted in by_scenario.items():
        answers = ({record.index: record.final_answer for record in _answers(key, database, artifact_dir)}
                   if any(s.key == key for s in SCENARIOS) else {})
        for item in wanted:
            outcome.items += 1
            expected = item.expected_output.get("final_answer") if isinstance(item.expected_output, dict) else None
            if expected is not None and answers.get(item.input.get("round")) == expected:
                outcome.passed += 1
            else:
                outcome.failures.append(item.item_id)
    return outcome
