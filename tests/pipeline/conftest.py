"""Fixtures of the skill tests (test_skills.py, test_skill_activation.py): the real
token counter, a loader over the fixture skills, and a writable copy of them; and of
the telemetry tests: a real OTLP receiver on 127.0.0.1."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from pipeline import SkillLoader
from pipeline._tokens import DynamicTokenCounter
from tests.pipeline.otlp_collector import Collector
from tests.pipeline.skill_helpers import FIXTURES, MODEL


@pytest.fixture(scope="module")
def counter() -> DynamicTokenCounter:
    return DynamicTokenCounter()


@pytest.fixture
def loader(counter: DynamicTokenCounter) -> SkillLoader:
    return SkillLoader(FIXTURES, token_counter=counter, model=MODEL)


@pytest.fixture
def skills(tmp_path: Path) -> Path:
    """A writable copy of the fixture skills, for tests that add hostile files."""
    root = tmp_path / "skills"
    shutil.copytree(FIXTURES, root)
    return root


@pytest.fixture
def collector() -> Iterator[Collector]:
    """An OTLP/HTTP receiver (spans, metrics, records, artifacts) on 127.0.0.1."""
    c = Collector()
    yield c
    c.close()
